"""Thousands of paced agent streams at once, through the gateway and through the byte-copy proxy
in the same run.

Each stream is an agent's answer from the fake upstream (``support/fakeupstream.py``, agent
shape): a silent "thinking" phase (``--think``, default 2–5 s), then a text delta every
``--gap`` (20–50 ms) for ``--duration`` (10–30 s). N of them (``--streams``, default
1000,2500,5000,10000) are opened over ``--ramp`` seconds by the load generator
(``support/streamclient.py``, its own process(es), raw sockets), first through the gateway
(passthrough: Anthropic in, Anthropic out), then through the byte-copy proxy
(``support/rawproxy.py``), each against the same upstream. While they run, this process opens
a new connection every ``--probe-every`` seconds for a short unpaced request, alternately
through the target and straight to the upstream: the difference of their time to first byte
is the added time a new request sees.

Per target and N it reports: RSS per open stream (peak RSS during the run minus RSS before it,
over N), CPU per chunk (the target process's CPU over the run / chunks the generator read),
per-chunk delay p50/p99/p999 (generator's clock at the read minus the upstream's at the write),
the new request's added time to first byte (p50/p99; over the whole run, and over the window in
which all N are open: from the end of the ramp until the first stream can end), how soon a
refused probe had its refusal, errors, the CPU share of the target,
the generator and the upstream over the run's busiest 2 s, and what limited first.

``--same-rate K`` adds, for each N above K, a run of K streams whose gaps are K/N as long: the
same chunks per second as N streams with fewer connections, for an N the generator cannot open
on a small machine.

    python -m benchmarks.e2e.many_streams [--streams 1000,2500] [--same-rate 2500] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.e2e.load import anthropic_request, fetch
from benchmarks.support.harness import SUPPORT, cpu_seconds, free_port, gateway_yaml, wait_port
from benchmarks.support.streamclient import BODY_MAX, LENGTH, refusal


@dataclass(frozen=True)
class Variant:
    """N streams of one agent shape; `rate_of` is the N whose chunks/s it has."""

    streams: int
    rate_of: int
    shape: str  # the fake upstream's path segment

    @property
    def label(self) -> str:
        if self.rate_of == self.streams:
            return f"{self.streams:,}"
        return f"{self.streams:,} at the rate of {self.rate_of:,}"


def _range_us(text: str, scale: float = 1.0) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    return int(float(lo) * scale * 1e6), int(float(hi or lo) * scale * 1e6)


def variants(args: argparse.Namespace) -> list[Variant]:
    think, duration = _range_us(args.think), _range_us(args.duration)
    out = []
    for n in (int(x) for x in args.streams.split(",") if x):
        pairs = [(n, n)]
        if args.same_rate and n > args.same_rate:
            pairs.append((args.same_rate, n))
        for streams, rate_of in pairs:
            gap = _range_us(args.gap, streams / rate_of)
            shape = f"at{think[0]}-{think[1]}g{gap[0]}-{gap[1]}d{duration[0]}-{duration[1]}"
            out.append(Variant(streams, rate_of, shape))
    return out


def gateway_config(
    upstream_port: int, port: int, shapes: list[str], args: argparse.Namespace
) -> str:
    lines = [
        f"  - {{name: p{i}, protocol: anthropic, key: k, models: [{shape}],"
        f" base_url: 'http://127.0.0.1:{upstream_port}/{shape}'}}"
        for i, shape in enumerate(shapes)
    ]
    text = gateway_yaml(port, "\n".join(lines))
    listen = f"port: {port}, max_connections: {args.max_connections}"
    listen += f", max_connections_per_address: {args.max_connections}"
    if args.shed_loop_lag_ms is not None:
        listen += f", shed_loop_lag_ms: {args.shed_loop_lag_ms}"
    text = text.replace(f"port: {port}}}", listen + "}")
    text += f"pool: {{max_connections: {args.pool_max}, max_idle: 1000}}\n"
    text += "observability: {access_log: false}\n"
    return text


def _machine_busy() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _open_files_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    return 0


async def _ttfb(port: int, request: bytes) -> tuple[float | None, str | None]:
    """Seconds to the first byte of a new connection's answer (None: none came), and why it
    was no answer (None: it was one)."""
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
        writer.write(request)
        head = await asyncio.wait_for(reader.read(12), 30)
        first = time.perf_counter() - start
    except (OSError, TimeoutError) as err:
        return None, type(err).__name__
    try:
        if not head.startswith(b"HTTP/1.1 200"):
            why = refusal(head[9:12].decode("latin-1"), *await _refusal_rest(reader, head))
            return first, why
        return first, None
    finally:
        writer.close()


async def _refusal_rest(reader: asyncio.StreamReader, head: bytes) -> tuple[bytes, bytes]:
    """A refusal's body and head, read to its end (bounded, as the load generator does)."""
    data = head
    try:
        async with asyncio.timeout(2):
            while b"\r\n\r\n" not in data and len(data) < BODY_MAX:
                more = await reader.read(4096)
                if not more:
                    break
                data += more
            end = data.find(b"\r\n\r\n")
            m = LENGTH.search(data[: end + 2]) if end >= 0 else None
            want = min(BODY_MAX, int(m.group(1))) if m else BODY_MAX
            while end >= 0 and len(data) - end - 4 < want:
                more = await reader.read(4096)
                if not more:
                    break
                data += more
    except (OSError, TimeoutError):
        pass
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return b"", data
    return data[end + 4 :], data[: end + 2]


# gw.overloaded from the loop's lag or listen.gateway.max_requests (the rest is the gateway short
# of upstream connections or descriptors).
_SHED = re.compile(r"event loop|max_requests")


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def _added(
    probes: dict[str, list[tuple[float, float]]], window: tuple[float, float]
) -> dict[str, float]:
    """Target minus direct time to first byte (ms) at p50 and p99, over probes sent in `window`."""
    inside = {k: [v for t, v in got if window[0] <= t < window[1]] for k, got in probes.items()}
    return {
        q: (_pct(inside["target"], p) - _pct(inside["direct"], p)) * 1e3
        for q, p in (("p50", 0.5), ("p99", 0.99))
    }


def _answered(
    probes: dict[str, list[tuple[float, float]]],
    refusals: list[tuple[float, float]],
    window: tuple[float, float],
) -> dict[str, float]:
    """A new request's answer while all N are open, served or refused: each target probe sent in
    `window` counts its added time to first byte (target minus the direct probes' median) when
    served, its time to the refusal's first byte when refused; p50 and p99 of those (ms), and
    how many of each."""
    direct = _pct([v for t, v in probes["direct"] if window[0] <= t < window[1]], 0.5)
    served = [v - direct for t, v in probes["target"] if window[0] <= t < window[1]]
    refused = [v for t, v in refusals if window[0] <= t < window[1]]
    both = served + refused
    return {
        "p50": _pct(both, 0.5) * 1e3,
        "p99": _pct(both, 0.99) * 1e3,
        "served": float(len(served)),
        "refused": float(len(refused)),
    }


async def _drive(
    target: dict[str, object],
    variant: Variant,
    args: argparse.Namespace,
    tmp: Path,
    pids: dict[str, int],
    ports: dict[str, int],
) -> dict[str, object]:
    name = str(target["name"])
    port, pid = int(str(target["port"])), int(str(target["pid"]))
    fine = name == "proxy"
    path = "/v1/messages" if name == "gateway" else f"/{variant.shape}/v1/messages"
    request_file = tmp / f"{name}-{variant.shape}.req"
    request_file.write_bytes(anthropic_request(port, path, variant.shape))
    probe = anthropic_request(
        port, "/v1/messages" if name == "gateway" else "/e20/v1/messages", "e20"
    )
    direct = anthropic_request(ports["upstream"], "/e20/v1/messages", "e20")
    rss_before = _rss_kib(pid)
    cpu_before = cpu_seconds(pid, fine=fine)
    busy_before = _machine_busy()
    per_client = [variant.streams // args.clients] * args.clients
    per_client[0] += variant.streams - sum(per_client)
    clients = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(SUPPORT / "streamclient.py"),
            "--port",
            str(port),
            "--request",
            str(request_file),
            "--streams",
            str(n),
            "--ramp",
            str(args.ramp),
            "--timeout",
            str(args.stream_timeout),
            stdout=subprocess.PIPE,
        )
        for n in per_client
    ]
    outputs = [asyncio.ensure_future(c.communicate()) for c in clients]
    rss_peak = rss_before
    samples: list[tuple[float, float, float, float]] = []  # time, target, upstream, generator CPU
    # Each probe's answer time, with the seconds since the generator started when it was sent.
    probes: dict[str, list[tuple[float, float]]] = {"target": [], "direct": []}
    probe_errors: dict[str, int] = {}
    refused_in: list[float] = []  # seconds to the first byte of each refusal
    refusal_log: list[tuple[float, float]] = []  # when each target refusal was sent, its time
    turn = 0
    started = time.monotonic()
    while not all(o.done() for o in outputs):
        now = time.monotonic()
        rss_peak = max(rss_peak, _rss_kib(pid))
        gen = 0.0
        for c in clients:
            try:
                gen += cpu_seconds(c.pid)
            except (FileNotFoundError, ProcessLookupError):
                pass
        samples.append((now, cpu_seconds(pid, fine=fine), cpu_seconds(pids["upstream"]), gen))
        which = "target" if turn % 2 == 0 else "direct"
        turn += 1
        first, why = await _ttfb(
            port if which == "target" else ports["upstream"], probe if which == "target" else direct
        )
        if why is None and first is not None:
            probes[which].append((now - started, first))
        else:
            key = f"{which}: {why}"
            probe_errors[key] = probe_errors.get(key, 0) + 1
            if first is not None:
                refused_in.append(first)
                if which == "target":
                    refusal_log.append((now - started, first))
        await asyncio.sleep(max(0.0, args.probe_every - (time.monotonic() - now)))
    results = [json.loads(o.result()[0].decode().strip().splitlines()[-1]) for o in outputs]
    cpu_used = cpu_seconds(pid, fine=fine) - cpu_before
    busy_after = _machine_busy()
    chunks = sum(r["chunks"] for r in results)
    wall = max(r["wall_s"] for r in results)
    gen_cpu = sum(r["cpu_s"] for r in results)
    errors: dict[str, int] = {}
    for r in results:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    # The busiest 2 s window of each process's CPU share.
    peak = {"target": 0.0, "upstream": 0.0, "generator": 0.0}
    for i, (t0, *c0) in enumerate(samples):
        for t1, *c1 in samples[i:]:
            if t1 - t0 >= 2.0:
                for k, a, b in zip(peak, c0, c1, strict=True):
                    peak[k] = max(peak[k], (b - a) / (t1 - t0))
                break
    # Every stream is open from the end of the ramp until the first can end (its shortest
    # silence and duration): the added time to first byte while all N run, beside the whole run's
    # (which includes the ramp's N new requests in --ramp seconds).
    all_open = (args.ramp, _range_us(args.think)[0] / 1e6 + _range_us(args.duration)[0] / 1e6)
    added = _added(probes, (0.0, float("inf")))
    added_open = _added(probes, all_open)
    answered_open = _answered(probes, refusal_log, all_open)
    delay = {
        k: max(r["delay_ms"][k] for r in results) if len(results) > 1 else results[0]["delay_ms"][k]
        for k in ("p50", "p99", "p999", "max")
    }
    limits = []
    need_fds = 2 * variant.streams + 64 if name == "gateway" else 2 * variant.streams + 16
    fd_limit = _open_files_limit(pid)
    if need_fds > fd_limit:
        limits.append(f"fd limit ({fd_limit:,} open files, {need_fds:,} needed)")
    if name == "gateway" and variant.streams > args.pool_max:
        limits.append(f"pool cap ({args.pool_max:,})")
    everything = {**errors}
    for k, v in probe_errors.items():
        everything[k] = everything.get(k, 0) + v
    # The gateway's own refusals, by their code (the load generator names them, see
    # support/streamclient.py): loop-lag shedding, the gateway short of its own upstream
    # connections or descriptors (also gw.overloaded), and any other 503.
    shedding = [k for k in everything if "gw.overloaded" in k and _SHED.search(k)]
    shed = sum(everything[k] for k in shedding)
    if shed:
        limits.append(f"load shedding ({shed:,} refused, gw.overloaded)")
    short = sum(v for k, v in everything.items() if "gw.overloaded" in k and k not in shedding)
    if short:
        limits.append(f"gateway short of connections or descriptors ({short:,}, gw.overloaded)")
    capped = sum(v for k, v in everything.items() if "503" in k and "gw.overloaded" not in k)
    if capped:
        limits.append(f"other 503 refusals ({capped:,}: see errors)")
    if any("connect" in k for k in everything):
        limits.append("connects failed (see errors)")
    if peak["generator"] / args.clients >= 0.85:
        limits.append(f"load generator CPU ({peak['generator']:.0%} of a core each at peak)")
    if peak["target"] >= 0.85:
        limits.append(f"{name} CPU ({peak['target']:.0%} of a core at peak)")
    machine = (busy_after[0] - busy_before[0]) / max(1, busy_after[1] - busy_before[1])
    if machine >= 0.9:
        limits.append(f"machine CPU ({machine:.0%} busy over the run)")
    return {
        "target": name,
        "streams": variant.streams,
        "rate_of": variant.rate_of,
        "completed": sum(r["completed"] for r in results),
        "errors": errors,
        "probe_errors": probe_errors,
        "chunks": chunks,
        "chunks_per_s": chunks / wall if wall else 0.0,
        "wall_s": wall,
        "rss_before_kib": rss_before,
        "rss_peak_kib": rss_peak,
        "rss_kib_per_stream": (rss_peak - rss_before) / variant.streams,
        "cpu_s": cpu_used,
        "cpu_us_per_chunk": cpu_used / chunks * 1e6 if chunks else float("nan"),
        "delay_ms": delay,
        "added_ttfb_ms": added,
        "added_ttfb_all_open_ms": added_open,
        "all_open_s": all_open,
        "answered_all_open_ms": answered_open,
        "probe_log": probes,
        "refusal_log": refusal_log,
        "refused_in_ms": {
            q: _pct(refused_in, p) * 1e3 for q, p in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))
        },
        "probes": {k: len(v) for k, v in probes.items()},
        "peak_cpu_share": peak,
        "generator_cpu_s": gen_cpu,
        "machine_busy": machine,
        "limited_by": limits or ["nothing observed"],
    }


def _row(r: dict[str, object], proxy: dict[str, object] | None) -> str:
    d, a, o = r["delay_ms"], r["added_ttfb_ms"], r["added_ttfb_all_open_ms"]
    assert isinstance(d, dict) and isinstance(a, dict) and isinstance(o, dict)
    cpu = float(str(r["cpu_us_per_chunk"]))
    ratio = ""
    if proxy is not None and float(str(proxy["cpu_us_per_chunk"])) > 0:
        ratio = f" ({cpu / float(str(proxy['cpu_us_per_chunk'])):.2g}×)"
    rss = float(str(r["rss_kib_per_stream"]))
    rss_ratio = ""
    if proxy is not None and float(str(proxy["rss_kib_per_stream"])) > 0:
        rss_ratio = f" ({rss / float(str(proxy['rss_kib_per_stream'])):.2g}×)"
    errors = r["errors"]
    assert isinstance(errors, dict)
    n_err = sum(errors.values())
    return (
        f"| {r['target']} | {r['completed']:,} / {r['streams']:,} | {r['chunks_per_s']:,.0f}"
        f" | {rss:.1f} KiB{rss_ratio} | {cpu:.1f} µs{ratio}"
        f" | {d['p50']:.1f} / {d['p99']:.1f} / {d['p999']:.1f} ms"
        f" | {o['p50']:.2f} / {o['p99']:.2f} ms | {a['p50']:.2f} / {a['p99']:.2f} ms"
        f" | {n_err:,} | {'; '.join(r['limited_by'])} |"  # type: ignore[arg-type]
    )


HEADER = (
    "| target | completed | chunks/s | RSS per stream | CPU per chunk | chunk delay p50 / p99 /"
    " p999 | added TTFB, all open, p50 / p99 | added TTFB, whole run | errors | limited by |"
    "\n|---|---|---|---|---|---|---|---|---|---|"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--streams", default="1000,2500,5000,10000", help="N, comma-separated")
    ap.add_argument("--same-rate", type=int, default=2500, help="0: no same-total-rate runs")
    ap.add_argument("--think", default="2-5", help="seconds of silence before the first token")
    ap.add_argument("--gap", default="0.02-0.05", help="seconds between tokens")
    ap.add_argument("--duration", default="10-30", help="seconds of tokens")
    ap.add_argument("--ramp", type=float, default=2.0, help="seconds over which the streams open")
    ap.add_argument("--clients", type=int, default=1, help="load generator processes")
    ap.add_argument("--probe-every", type=float, default=0.1, help="seconds between probes")
    ap.add_argument("--stream-timeout", type=float, default=120.0)
    ap.add_argument(
        "--pool-max", type=int, default=20000, help="the gateway's pool.max_connections"
    )
    ap.add_argument(
        "--max-connections",
        type=int,
        default=30000,
        help="the gateway's listen.gateway.max_connections and max_connections_per_address",
    )
    ap.add_argument("--shed-loop-lag-ms", type=int, help="the gateway's shed_loop_lag_ms")
    ap.add_argument("--targets", default="gateway,proxy")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the children inherit it
    runs = variants(args)
    tmp = Path(tempfile.mkdtemp(prefix="twserve-streams-"))
    ports = {"upstream": free_port(), "proxy": free_port(), "gateway": free_port()}
    env = {**os.environ, "TWSERVE_HOME": str(tmp)}
    cfg = tmp / "config.yaml"
    cfg.write_text(
        gateway_config(ports["upstream"], ports["gateway"], [v.shape for v in runs] + ["e20"], args)
    )
    py, quiet = sys.executable, subprocess.DEVNULL
    commands = {
        "upstream": [py, str(SUPPORT / "fakeupstream.py"), "--port", str(ports["upstream"])],
        "proxy": [
            py,
            str(SUPPORT / "rawproxy.py"),
            "--port",
            str(ports["proxy"]),
            "--target",
            str(ports["upstream"]),
        ],
        "gateway": [
            py,
            "-m",
            "twserve.cli.main",
            "serve",
            "--config",
            str(cfg),
            "--data-dir",
            str(tmp),
        ],
    }
    procs = {k: subprocess.Popen(c, env=env, stdout=quiet) for k, c in commands.items()}
    pids = {k: p.pid for k, p in procs.items()}
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    results: list[dict[str, object]] = []
    try:
        for name, port in ports.items():
            wait_port(port, procs[name])
        fetch_ok = asyncio.run(
            fetch(ports["gateway"], anthropic_request(ports["gateway"], "/v1/messages", "e20"))
        )
        if fetch_ok.count(b"data:") < 15:
            raise RuntimeError(f"the gateway's answer: {fetch_ok[:500]!r}")
        targets = [
            {"name": t, "port": ports[t], "pid": pids[t]} for t in args.targets.split(",") if t
        ]
        for variant in runs:
            for target in targets:
                print(
                    f"{variant.label} streams through {target['name']} ...",
                    file=sys.stderr,
                    flush=True,
                )
                r = asyncio.run(_drive(target, variant, args, tmp, pids, ports))
                r["label"] = variant.label
                r["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
                results.append(r)
                time.sleep(1.0)  # the last streams' connections close
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    print(
        f"\nthink {args.think} s, a token every {args.gap} s, {args.duration} s of tokens,"
        f" opened over {args.ramp} s; {os.cpu_count()} cores; load average before"
        f" {' '.join(load_before)}, after {' '.join(load_after)}"
    )
    for label in dict.fromkeys(str(r["label"]) for r in results):
        rows = [r for r in results if r["label"] == label]
        proxy = next((r for r in rows if r["target"] == "proxy"), None)
        print(f"\n{label} streams (load average after: {' '.join(rows[-1]['loadavg_after'])})\n")  # type: ignore[arg-type]
        print(HEADER)
        for r in rows:
            print(_row(r, proxy if r is not proxy else None))
        for r in rows:
            for kind, errors in (("streams", r["errors"]), ("probes", r["probe_errors"])):
                if errors:
                    print(f"\n{r['target']} {kind}' errors: {json.dumps(errors)}")
            took = r["refused_in_ms"]
            assert isinstance(took, dict)
            if took["max"] == took["max"]:  # not NaN: some probe was answered with a refusal
                print(
                    f"{r['target']} probes refused within {took['p50']:.1f} ms p50,"
                    f" {took['p99']:.1f} ms p99, {took['max']:.1f} ms at most"
                )
            got = r["answered_all_open_ms"]
            assert isinstance(got, dict)
            print(
                f"{r['target']} new requests while all are open: {got['served']:.0f} served,"
                f" {got['refused']:.0f} refused; answered (added TTFB, or the refusal)"
                f" {got['p50']:.1f} ms p50, {got['p99']:.1f} ms p99"
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"load_before": load_before, "load_after": load_after, "runs": results}, indent=2
            )
        )


if __name__ == "__main__":
    main()
