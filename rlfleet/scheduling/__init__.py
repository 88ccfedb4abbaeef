"""The request logic shared by the coordinator and the local sampler.

:class:`~rlfleet.scheduling.scheduler.Scheduler` decides which worker runs
which episode and when a request is complete: pure Python, no gRPC, no
threads, no clocks. It imports neither the coordinator nor the client.
"""
