"""Several "hosts" on one machine: network namespaces joined by veth pairs.

A :class:`Network` makes a hub namespace (the coordinator's host) and host
namespaces (the workers' hosts), each joined to the hub by its own veth pair,
plus one veth pair from the root namespace (where the test, the learner,
runs) to the hub. Every link is a point-to-point /30 in 198.18.0.0/15, the
range RFC 2544 sets aside for network tests, so no address can collide with
a real network; only the root link is visible outside the test's namespaces,
and its /30 is picked from the test's pid so concurrent runs do not clash.
Nothing is routed: each host talks to the hub over its own link only.

Faults (this kernel has no ``tc netem``):

* loss: an nftables rule ``numgen random mod 100 < N drop`` on a host's link;
* partition: an nftables rule dropping everything on a host's link;
* latency: :class:`DelayRelay`, a TCP relay in the host's namespace that
  holds every byte for a fixed delay in each direction;
* frozen or dead peers: SIGSTOP / SIGKILL (see ``tests/fleet_processes.py``).

Everything is removed in ``close`` (namespaces take their veth ends with
them), also when the test fails. This module imports only the standard
library, so that it also runs as the relay's script::

    python tests/netns_support.py relay --listen 127.0.0.1:0 --target H:P \\
        --delay 0.05 --port-file FILE
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

#: RFC 2544's benchmarking range: reserved for tests, never routed.
TEST_RANGE = ipaddress.ip_network("198.18.0.0/15")
#: Links per network (one /30 each); the root link's block comes from the pid.
_LINKS_PER_RUN = 16
_BLOCKS = TEST_RANGE.num_addresses // 4 // _LINKS_PER_RUN
#: nftables table the faults live in (inside host namespaces only).
_NFT_TABLE = "rlfleet_faults"
_NETWORK_NUMBERS = itertools.count()


def _process_tag(tag: str) -> str:
    """``tag`` plus this process's pid, short enough for interface names (<= 15 bytes)."""
    return f"{tag}{os.getpid() % 10000:04d}"


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here, or None if they can.

    Tries what the tests do (root, ``ip netns add``, ``nft``) with a probe
    namespace that is removed at once.
    """
    if os.geteuid() != 0:
        return "needs root to create network namespaces (run the suite as root)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"needs the `{tool}` command (iproute2 / nftables)"
    probe = f"rlfprobe{os.getpid()}"
    try:
        _run(["ip", "netns", "add", probe])
    except subprocess.CalledProcessError as exc:
        return f"`ip netns add` is not allowed here: {exc.stderr.strip() or exc}"
    try:
        _run(["ip", "netns", "exec", probe, "nft", "list", "tables"])
    except subprocess.CalledProcessError as exc:
        return f"nftables does not work in a namespace here: {exc.stderr.strip() or exc}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _run(argv: Sequence[str]) -> str:
    """Runs a command; raises CalledProcessError with its stderr on failure."""
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
    return done.stdout


@dataclass
class Host:
    """One namespace and its link to the hub.

    Attributes:
        name: The test's name for it.
        namespace: The network namespace.
        address: Its address on its link (the hub reaches it there).
        hub_address: The hub's address on the same link (it dials this).
        interface: Its end of the veth pair, inside ``namespace``.
    """

    name: str
    namespace: str
    address: str
    hub_address: str
    interface: str
    faults: list[str] = field(default_factory=list)

    @property
    def prefix(self) -> list[str]:
        """Prepend to a command to run it on this host."""
        return ["ip", "netns", "exec", self.namespace]

    def run(self, *argv: str) -> str:
        """Runs a command in the namespace and returns its output."""
        return _run([*self.prefix, *argv])


class Network:
    """A hub namespace, host namespaces and their veth links (a context manager).

    Args:
        tag: Short text in the namespace names, to find leftovers.
    """

    def __init__(self, tag: str = "rlf") -> None:
        number = next(_NETWORK_NUMBERS)
        # Unique per process and network: a closed network's veths vanish
        # asynchronously, so the next one must not reuse their names.
        self._id = f"{_process_tag(tag)}{number % 100:02d}"
        self._block = (os.getpid() * 7 + number) % _BLOCKS * _LINKS_PER_RUN
        self._links = 0
        self._namespaces: list[str] = []
        self._root_interfaces: list[str] = []
        self.hub = self._namespace("hub")
        self.hub_root_address, self.root_address = self._link_root_to_hub()
        self.hosts: list[Host] = []

    # --- building ----------------------------------------------------------------

    def _namespace(self, role: str) -> str:
        name = f"{self._id}-{role}"
        _run(["ip", "netns", "add", name])
        self._namespaces.append(name)
        _run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"])
        return name

    def _subnet(self) -> tuple[str, str]:
        """The (hub side, far side) addresses of the next /30 link."""
        if self._links >= _LINKS_PER_RUN:
            raise RuntimeError(f"a Network holds at most {_LINKS_PER_RUN} links")
        index = self._block + self._links
        self._links += 1
        base = int(TEST_RANGE.network_address) + 4 * index
        return str(ipaddress.ip_address(base + 1)), str(ipaddress.ip_address(base + 2))

    def _veth(self, suffix: str) -> tuple[str, str]:
        """Names of a new veth pair (kernel interface names are at most 15 bytes)."""
        near, far = f"{self._id}{suffix}h", f"{self._id}{suffix}x"
        _run(["ip", "link", "add", near, "type", "veth", "peer", "name", far])
        return near, far

    def _configure(self, namespace: str | None, interface: str, address: str) -> None:
        prefix = ["ip", "netns", "exec", namespace] if namespace else []
        _run([*prefix, "ip", "addr", "add", f"{address}/30", "dev", interface])
        _run([*prefix, "ip", "link", "set", interface, "up"])

    def _link_root_to_hub(self) -> tuple[str, str]:
        hub_side, root_side = self._subnet()
        hub_if, root_if = self._veth("r")
        self._root_interfaces.append(root_if)
        _run(["ip", "link", "set", hub_if, "netns", self.hub])
        self._configure(self.hub, hub_if, hub_side)
        self._configure(None, root_if, root_side)
        return hub_side, root_side

    def add_host(self, name: str) -> Host:
        """A new namespace linked to the hub by its own veth pair."""
        number = len(self.hosts)
        namespace = self._namespace(f"h{number}")
        hub_side, host_side = self._subnet()
        hub_if, host_if = self._veth(str(number))
        _run(["ip", "link", "set", hub_if, "netns", self.hub])
        _run(["ip", "link", "set", host_if, "netns", namespace])
        self._configure(self.hub, hub_if, hub_side)
        self._configure(namespace, host_if, host_side)
        host = Host(name, namespace, host_side, hub_side, host_if)
        self.hosts.append(host)
        return host

    @property
    def hub_prefix(self) -> list[str]:
        """Prepend to a command to run it on the hub."""
        return ["ip", "netns", "exec", self.hub]

    # --- faults --------------------------------------------------------------------

    def drop_randomly(self, host: Host, percent: int) -> None:
        """Drops ``percent`` % of the packets on the host's link, both ways."""
        if not 0 < percent < 100:
            raise ValueError(f"percent must be in 1..99, got {percent}")
        self._rules(host, f"numgen random mod 100 < {percent} drop")

    def partition(self, host: Host) -> None:
        """Drops every packet on the host's link (the link stays up)."""
        self._rules(host, "drop")

    def heal(self, host: Host) -> None:
        """Removes every fault rule of the host."""
        if host.faults:
            host.run("nft", "delete", "table", "inet", _NFT_TABLE)
            host.faults.clear()

    def _rules(self, host: Host, verdict: str) -> None:
        """Adds ``verdict`` for packets in and out of the host's link (not loopback)."""
        if not host.faults:
            host.run("nft", "add", "table", "inet", _NFT_TABLE)
            for hook in ("input", "output"):
                host.run(
                    "nft",
                    "add",
                    "chain",
                    "inet",
                    _NFT_TABLE,
                    hook,
                    f"{{ type filter hook {hook} priority 0 ; }}",
                )
        for hook, match in (("input", "iifname"), ("output", "oifname")):
            host.run(
                "nft",
                "add",
                "rule",
                "inet",
                _NFT_TABLE,
                hook,
                match,
                host.interface,
                *verdict.split(),
            )
        host.faults.append(verdict)

    # --- teardown --------------------------------------------------------------------

    def close(self) -> None:
        """Removes every namespace and veth this network made (idempotent)."""
        for namespace in reversed(self._namespaces):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
        self._namespaces.clear()
        # Deleting a namespace deletes its veth ends, and with them their
        # peers, but asynchronously: delete the root end ourselves too.
        for interface in self._root_interfaces:
            subprocess.run(["ip", "link", "del", interface], capture_output=True, check=False)
        self._root_interfaces.clear()

    def __enter__(self) -> Network:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def leftover_namespaces(tag: str = "rlf") -> list[str]:
    """Namespaces of this process's networks that still exist."""
    prefix = _process_tag(tag)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in listed.stdout.splitlines() if line.startswith(prefix)]


# --- latency: a delaying TCP relay ---------------------------------------------------


class DelayRelay:
    """A TCP relay in a host's namespace that delays every byte by ``delay`` each way.

    The worker dials ``address`` (loopback inside its namespace); the relay
    forwards to ``target`` over the host's link. Bytes keep their order and
    the relay never limits throughput: each read is stamped and written out
    ``delay`` seconds later.

    Args:
        host: Where the relay runs.
        target: ``HOST:PORT`` it forwards to.
        delay: One-way delay in seconds.
        log: File for the relay's output.
    """

    def __init__(self, host: Host, target: str, delay: float, log: Path) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="rlfleet-relay-"))
        port_file = self._dir / "port"
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    *host.prefix,
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "relay",
                    "--listen",
                    "127.0.0.1:0",
                    "--target",
                    target,
                    "--delay",
                    str(delay),
                    "--port-file",
                    str(port_file),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the delay relay did not start; see {log}")
            time.sleep(0.05)
        self.address = f"127.0.0.1:{port_file.read_text().strip()}"

    def close(self) -> None:
        """Stops the relay (its connections drop)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, 9)
        self.process.wait(timeout=10)
        shutil.rmtree(self._dir, ignore_errors=True)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copies one direction, each read written ``delay`` seconds after it arrived."""
    loop = asyncio.get_running_loop()
    pending: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def receive() -> None:
        try:
            while data := await reader.read(1 << 16):
                pending.put_nowait((loop.time() + delay, data))
        finally:
            pending.put_nowait((loop.time() + delay, b""))

    async def send() -> None:
        while True:
            due, data = await pending.get()
            await asyncio.sleep(max(due - loop.time(), 0.0))
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    with contextlib.suppress(ConnectionError, OSError):
        await asyncio.gather(receive(), send())


async def _serve_relay(listen: str, target: str, delay: float, port_file: Path) -> None:
    target_host, _, target_port = target.rpartition(":")

    async def connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(target_host, int(target_port))
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(_pump(reader, up_writer, delay), _pump(up_reader, writer, delay))
        finally:
            up_writer.close()
            writer.close()

    host, _, port = listen.rpartition(":")
    server = await asyncio.start_server(connect, host, int(port))
    bound = server.sockets[0].getsockname()[1]
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(f"{bound}\n")
    tmp.replace(port_file)
    async with server:
        await server.serve_forever()


def _main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="netns_support.py")
    commands = parser.add_subparsers(dest="command", required=True)
    relay = commands.add_parser("relay", help="run a delaying TCP relay")
    relay.add_argument("--listen", required=True)
    relay.add_argument("--target", required=True)
    relay.add_argument("--delay", type=float, required=True)
    relay.add_argument("--port-file", type=Path, required=True)
    args = parser.parse_args(argv)
    asyncio.run(_serve_relay(args.listen, args.target, args.delay, args.port_file))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
