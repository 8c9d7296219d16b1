"""What a step reports and what a run remembers: `Logs`, the `History`, `step_output`, plotting.

Also the monitored values of the callbacks and the ranking of a population's members (`monitor.py`).

May import: base.
"""
