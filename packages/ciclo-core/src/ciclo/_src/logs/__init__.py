"""What a step reports and what a run remembers: `Logs`, the `History`, `step_output`, plotting.

May import: base.
"""
