"""The ground floor: time (`Elapsed`, schedules), protocols, batches, roles, files, reprs and checks.

May import: nothing of ciclo's outside this room.
"""
