"""The request logic shared by the coordinator and the local sampler.

:class:`~rlfleet.scheduling.scheduler.Scheduler` decides which worker runs
which episode and when a request is complete: pure Python, no gRPC, no
threads, no clocks. It imports neither the coordinator nor the client.

It composes one part per responsibility: ``books`` (workers, tasks and
requests; ``task_units``, each task's units as columns), ``units``
(episode units and worker capacities), ``tail_moves`` (units moved at a
Sample request's tail), ``windows`` (fragment windows), ``failures`` (lost
workers and orphaned streams); ``orders`` holds the values it takes and
gives.
"""
