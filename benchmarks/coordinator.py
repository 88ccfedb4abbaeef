"""The coordinator's CPU per env step and per result message, from measurements.

Run: ``python benchmarks/coordinator.py [--workers 2] [--envs 8] [--steps 10000 50000]``.

A coordinator runs as its own process (``rlfleet coordinator``), so its CPU
time is its own; W workers run :class:`~rlfleet.worker.remote.RemoteWorker`
with a given ``flush_steps`` and count the result messages they send; the
learner (this process) asks for requests of ``--steps`` steps. The same
requests are made with small and large results (``--flush`` values) and
two request sizes (``--steps`` values), and the
coordinator's CPU per request is fitted as ``a + b * steps + c * messages``
by least squares over the runs: ``b`` is its CPU per env step, ``c`` per
result message, ``a`` per request. docs/performance.md explains what the
figures mean for how many workers one coordinator can serve.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from rlfleet.client import RemoteSampler
from rlfleet.envs.config import EnvConfig
from rlfleet.policies.mlp import MLPCategoricalPolicy
from rlfleet.policies.spec import PolicySpec

_WORKER = """
import sys
from pathlib import Path
from rlfleet.worker import _session
from rlfleet.worker.remote import RemoteWorker, WorkerConfig

address, envs, flush, count_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
sent = 0
send = _session.Session._send_result

def counting(self, task_id, batch):
    global sent
    send(self, task_id, batch)
    sent += 1
    Path(count_file).write_text(str(sent))

_session.Session._send_result = counting
sys.exit(RemoteWorker(WorkerConfig(address, envs=envs, flush_steps=flush)).run())
"""


def _messages(count_files: list[Path]) -> int:
    return sum(int(f.read_text() or 0) for f in count_files if f.exists())


def _wait_for_port(port_file: Path, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = port_file.read_text().strip() if port_file.exists() else ""
        if text:
            return int(text)
        time.sleep(0.05)
    raise TimeoutError(f"the coordinator wrote no port file within {timeout:g} s")


def measure(workers: int, envs: int, flush: int, steps: int, requests: int) -> list[tuple]:
    """Runs ``requests`` requests; returns (steps, messages, coordinator CPU s) for each."""
    directory = Path(tempfile.mkdtemp(prefix="rlfleet-coordinator-bench-"))
    port_file = directory / "port"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "rlfleet", "--log-level", "WARNING", "coordinator",
         "--listen", "127.0.0.1:0", "--port-file", str(port_file), "--env", "CartPole-v1"],
        env=env,
    )  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    try:
        address = f"127.0.0.1:{_wait_for_port(port_file)}"
        count_files = [directory / f"sent-{i}" for i in range(workers)]
        for count_file in count_files:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        _WORKER,
                        address,
                        str(envs),
                        str(flush),
                        str(count_file),
                    ],
                    env=env,
                )
            )
        sampler = RemoteSampler(address, seed=0, timeout=600)
        policy = MLPCategoricalPolicy(EnvConfig("CartPole-v1").env_spec(), seed=0)
        sampler.update_agent(PolicySpec("mlp-categorical", {"hidden_sizes": [32, 32]}))
        params = policy.get_param_values()
        sampler.obtain_samples(0, steps, agent_update=params)  # warm-up, all workers joined
        cpu = psutil.Process(coordinator.pid)
        rows = []
        for itr in range(1, requests + 1):
            before_cpu, before_msgs = sum(cpu.cpu_times()[:2]), _messages(count_files)
            batch = sampler.obtain_samples(itr, steps, agent_update=params)
            time.sleep(0.2)  # the counters are written after each send
            spent = sum(cpu.cpu_times()[:2]) - before_cpu
            rows.append((batch.total_steps, _messages(count_files) - before_msgs, spent))
        sampler.close()
        return rows
    finally:
        for proc in [*procs, coordinator]:
            proc.terminate()
        for proc in [*procs, coordinator]:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument(
        "--steps", type=int, nargs="+", default=[10_000, 50_000], help="steps per request"
    )
    parser.add_argument("--requests", type=int, default=3, help="timed requests per setting")
    parser.add_argument("--flush", type=int, nargs="+", default=[256, 4096])
    args = parser.parse_args()
    rows = []
    runs = [(flush, steps) for flush in args.flush for steps in args.steps]
    for flush, request_steps in runs:
        for steps, messages, cpu in measure(
            args.workers, args.envs, flush, request_steps, args.requests
        ):
            rows.append((steps, messages, cpu))
            print(
                f"flush_steps {flush:>6}: {steps:>7} steps, {messages:>4} messages, "
                f"coordinator {cpu * 1e3:8.1f} ms CPU ({cpu * 1e6 / steps:.2f} us/step)"
            )
    design = np.array([[1.0, s, m] for s, m, _ in rows])
    spent = np.array([c for _, _, c in rows])
    (per_request, per_step, per_message), *_ = np.linalg.lstsq(design, spent, rcond=None)
    print(
        f"fit: {per_step * 1e6:.2f} us per step + {per_message * 1e6:.0f} us per message "
        f"+ {per_request * 1e3:.2f} ms per request"
    )


if __name__ == "__main__":
    main()
