"""The ground floor: what every other room stands on.

Owns the time of a loop (`Elapsed`, periods, schedules), the protocols and type
aliases at ciclo's extension points (`types`), batch counting and stacking,
field roles of managed states, finite checks, the closed-world file operations,
bounded reprs, argument checks and warnings, and how adapter packages are found.

May import: nothing of ciclo's outside this room.
"""
