from trainspeed.telemetry.rundir import RunData, read_run

__all__ = ["RunData", "read_run"]
