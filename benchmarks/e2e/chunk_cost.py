"""What converting one streamed chunk costs, this checkout beside another (docs/benchmarks.md).

Each pair feeds a recorded transcript (tests/data/fixtures/streams) to a fresh
`twproto.StreamTranslator`, one SSE event per network chunk as providers flush: the transcript's
opening events, then its content deltas cycled to ``--chunks`` delta events, then its closing
events. The cost per chunk is the difference between that stream and the same stream with no
deltas (opening and closing only), divided by the number of deltas: interpreter start, imports
and the stream's fixed cost are taken out, and what is left is the marginal cost of one delta.

Two measures, each checkout in processes of its own (the child is this file, run by path with
``PYTHONPATH`` naming the checkout's ``libs/twproto``; it imports nothing but the standard
library and twproto, so one script measures both checkouts):

* instructions (``--callgrind``): `valgrind --tool=callgrind` counts the instructions of one
  child per pair and size (``--chunks`` deltas, and none). The count does not depend on what
  else the machine runs, so a difference of a fraction of a percent is a difference in the code;
  ``PYTHONHASHSEED`` is fixed so that hashing does not vary it. valgrind is a measuring tool,
  not a dependency (``apt-get install valgrind``).
* time: ``--runs`` rounds, the checkouts alternated within each round and their order swapped
  every other round (A B B A …), so that a slow spell of the machine falls on both. Each child
  times every pair ``--repeat`` times and keeps its best; the report gives, per pair and
  checkout, the min and median over the rounds, and the ratio of the medians.

The ``control`` pair does the same per-chunk work in both checkouts (the standard library's
JSON decoder and encoder on each delta's data; twproto is not touched), so its ratio is what the
machine's noise alone gives; ``sse_decode`` is twproto's SSE decoder alone, the floor every
converted path pays.

    python -m benchmarks.e2e.chunk_cost [--chunks 2000] [--runs 10] [--pairs a,b] \
        [--baseline-root DIR] [--baseline-python PY] [--callgrind] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
STREAMS = ROOT / "tests" / "data" / "fixtures" / "streams"
WARM_UP = 16  # deltas in the stream each child converts before it measures


@dataclass(frozen=True, slots=True)
class Pair:
    """One measured path: the upstream's format, the client's, the transcript and how its delta
    events are told apart (every event between the first and the last delta must be one)."""

    upstream: str  # a twproto.Dialect value; "" for the pairs that use no translator
    client: str
    transcript: str
    delta: Callable[[bytes], bool]


def _has(*needles: bytes, without: bytes = b"") -> Callable[[bytes], bool]:
    return lambda event: all(n in event for n in needles) and not (without and without in event)


ANTHROPIC_TEXT = _has(b'"text_delta"')
PAIRS: dict[str, Pair] = {
    "anthropic_to_chat": Pair("anthropic", "openai-chat", "anthropic-text.sse", ANTHROPIC_TEXT),
    "anthropic_thinking_to_chat": Pair(
        "anthropic",
        "openai-chat",
        "anthropic-thinking-signature-text.sse",
        _has(b'"thinking_delta"'),
    ),
    "chat_to_anthropic": Pair(
        "openai-chat",
        "anthropic",
        "openai-chat-text-include-usage.sse",
        _has(b'"delta":{"content":"', without=b'"finish_reason":"'),
    ),
    "responses_to_anthropic": Pair(
        "openai-responses",
        "anthropic",
        "openai-responses-text.sse",
        _has(b"response.output_text.delta"),
    ),
    "gemini_to_chat": Pair(
        "gemini", "openai-chat", "gemini-sse-text.sse", _has(b'"text"', without=b"finishReason")
    ),
    # Passthrough: the client speaks the upstream's format; bytes relayed and watched.
    "anthropic_relay": Pair("anthropic", "anthropic", "anthropic-text.sse", ANTHROPIC_TEXT),
    "chat_relay": Pair(
        "openai-chat",
        "openai-chat",
        "openai-chat-text-include-usage.sse",
        _has(b'"delta":{"content":"', without=b'"finish_reason":"'),
    ),
    "gemini_relay": Pair(
        "gemini", "gemini", "gemini-sse-text.sse", _has(b'"text"', without=b"finishReason")
    ),
    "sse_decode": Pair("", "sse", "anthropic-text.sse", ANTHROPIC_TEXT),
    "control": Pair("", "control", "anthropic-text.sse", ANTHROPIC_TEXT),
}


def stream_chunks(pair: Pair, deltas: int) -> list[bytes]:
    """The transcript's events, one per chunk, with its delta events cycled to `deltas`."""
    raw = (STREAMS / pair.transcript).read_bytes().replace(b"\r\n", b"\n")
    events = [block + b"\n\n" for block in raw.split(b"\n\n") if block.strip()]
    first = next(i for i, e in enumerate(events) if pair.delta(e))
    last = max(i for i, e in enumerate(events) if pair.delta(e))
    body = events[first : last + 1]
    if not all(pair.delta(e) for e in body):
        raise ValueError(f"{pair.transcript}: its deltas are not one run of events")
    cycled = (body * (deltas // len(body) + 1))[:deltas]
    return events[:first] + cycled + events[last + 1 :]


# The child: what runs in each checkout's process. Standard library and twproto only.


def _converter(pair: Pair) -> Callable[[list[bytes]], int]:
    """A function that converts a whole stream and returns the client bytes' length."""
    if pair.client == "control":
        data = re.compile(rb"^data: (.*)$", re.M)

        def control(chunks: list[bytes]) -> int:
            size = 0
            for chunk in chunks:
                for found in data.finditer(chunk):
                    size += len(json.dumps(json.loads(found.group(1))).encode())
            return size

        return control
    import twproto

    if pair.client == "sse":

        def decode(chunks: list[bytes]) -> int:
            feed = twproto.SSEDecoder().feed
            return sum(len(feed(chunk)) for chunk in chunks)

        return decode

    upstream, client = twproto.Dialect(pair.upstream), twproto.Dialect(pair.client)

    def convert(chunks: list[bytes]) -> int:
        translator = twproto.new_stream_translator(
            upstream, client, client_model="client-model", created=1
        )
        feed = translator.feed
        size = 0
        for chunk in chunks:
            size += len(feed(chunk))
        size += len(translator.end())
        if not translator.finished:
            raise RuntimeError(f"{pair.upstream} → {pair.client}: the stream did not finish")
        return size

    return convert


def child(names: Sequence[str], deltas: int, repeat: int) -> dict[str, Any]:
    """Convert each pair's stream once (`repeat` 0: an instruction count, the stream with no
    deltas counted by another child), or time it `repeat` times beside the stream without
    deltas and give the best of each."""
    out: dict[str, Any] = {}
    for name in names:
        pair = PAIRS[name]
        convert = _converter(pair)
        # A first stream warms what a first delta sets up (caches, specialised bytecode), so
        # the difference between the two counts or times is deltas only.
        convert(stream_chunks(pair, WARM_UP))
        full = stream_chunks(pair, deltas)
        figures: dict[str, Any] = {"bytes_out": convert(full)}
        if repeat:
            empty = stream_chunks(pair, 0)
            figures["bytes_out_without_deltas"] = convert(empty)
            best_full = best_empty = float("inf")
            for _ in range(repeat):
                start = time.perf_counter_ns()
                convert(empty)
                middle = time.perf_counter_ns()
                convert(full)
                end = time.perf_counter_ns()
                best_empty = min(best_empty, middle - start)
                best_full = min(best_full, end - middle)
            figures["ns_per_chunk"] = (best_full - best_empty) / deltas
        out[name] = figures
    return out


# The driver: runs the children and reads their figures.


@dataclass(frozen=True, slots=True)
class Checkout:
    name: str
    root: Path
    python: str

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": str(self.root / "libs" / "twproto"),
            "PYTHONHASHSEED": "0",
        }

    def command(self, *args: str) -> list[str]:
        return [self.python, str(Path(__file__).resolve()), "--child", *args]


def _run_child(checkout: Checkout, args: Sequence[str], wrap: Sequence[str] = ()) -> str:
    done = subprocess.run(
        [*wrap, *checkout.command(*args)],
        env=checkout.env(),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{checkout.name}: {done.stderr[-3000:]}")
    return done.stdout if not wrap else done.stderr


def where_twproto(checkout: Checkout) -> str:
    """The folder twproto is imported from in `checkout`'s child (that it is its own)."""
    done = subprocess.run(
        [checkout.python, "-c", "import twproto; print(twproto.__file__)"],
        env=checkout.env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return str(Path(done.stdout.strip()).parent)


_COLLECTED = re.compile(r"Collected : (\d+)")


def instructions(checkout: Checkout, name: str, deltas: int) -> int:
    """Instructions of one child converting `name`'s stream once with `deltas` deltas."""
    wrap = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    err = _run_child(checkout, ["--pairs", name, "--chunks", str(deltas), "--repeat", "0"], wrap)
    found = _COLLECTED.search(err)
    if found is None:
        raise RuntimeError(f"no instruction count from callgrind: {err[-2000:]}")
    return int(found.group(1))


def count_instructions(
    checkouts: Sequence[Checkout], names: Sequence[str], deltas: int
) -> dict[str, dict[str, float]]:
    """Per pair and checkout: instructions per delta (the stream with `deltas` deltas minus the
    same stream without)."""
    per: dict[str, dict[str, float]] = {}
    for name in names:
        for checkout in checkouts:
            full, empty = instructions(checkout, name, deltas), instructions(checkout, name, 0)
            per.setdefault(name, {})[checkout.name] = round((full - empty) / deltas, 1)
            print(f"  {name} {checkout.name}: {per[name][checkout.name]} instr/chunk", flush=True)
    return per


def time_rounds(
    checkouts: Sequence[Checkout], names: Sequence[str], deltas: int, runs: int, repeat: int
) -> dict[str, dict[str, list[float]]]:
    """ns per delta, per pair and checkout, one value per round (A B B A … order)."""
    values: dict[str, dict[str, list[float]]] = {n: {c.name: [] for c in checkouts} for n in names}
    args = ["--pairs", ",".join(names), "--chunks", str(deltas), "--repeat", str(repeat)]
    for index in range(runs):
        order = checkouts if index % 2 == 0 else list(reversed(checkouts))
        for checkout in order:
            figures = json.loads(_run_child(checkout, args))
            for name in names:
                values[name][checkout.name].append(figures[name]["ns_per_chunk"])
        print(f"  round {index + 1}/{runs} done", flush=True)
    return values


def summary(
    values: dict[str, dict[str, list[float]]], checkouts: Sequence[Checkout]
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, per in values.items():
        row: dict[str, Any] = {
            c.name: {
                "min": round(min(per[c.name]), 1),
                "median": round(statistics.median(per[c.name]), 1),
            }
            for c in checkouts
        }
        if len(checkouts) == 2:
            a, b = (statistics.median(per[c.name]) for c in checkouts)
            row["ratio_median"] = round(b / a, 3) if a else None
            a, b = (min(per[c.name]) for c in checkouts)
            row["ratio_min"] = round(b / a, 3) if a else None
        out[name] = row
    return out


def table(report: dict[str, Any], checkouts: Sequence[Checkout]) -> str:
    """The figures as a Markdown table, one row per pair."""
    names = [c.name for c in checkouts]
    head = ["pair"]
    if "instructions_per_chunk" in report:
        head += [f"instr {n}" for n in names] + (["ratio"] if len(names) == 2 else [])
    head += [f"ns {n} min / median" for n in names] + (["ratio"] if len(names) == 2 else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for pair, row in report["ns_per_chunk"].items():
        cells = [pair]
        if "instructions_per_chunk" in report:
            counts = report["instructions_per_chunk"][pair]
            cells += [f"{counts[n]:,.0f}" for n in names]
            if len(names) == 2:
                cells.append(f"{counts[names[1]] / counts[names[0]]:.4f}")
        cells += [f"{row[n]['min']:,.0f} / {row[n]['median']:,.0f}" for n in names]
        if len(names) == 2:
            cells.append(f"{row['ratio_median']:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--chunks", type=int, default=2000, help="delta events per stream")
    ap.add_argument("--runs", type=int, default=10, help="timed rounds (each checkout once)")
    ap.add_argument("--repeat", type=int, default=20, help="timed conversions per child; best")
    ap.add_argument(
        "--pairs", default=",".join(PAIRS), help="comma-separated, of: " + ", ".join(PAIRS)
    )
    ap.add_argument("--baseline-root", help="also measure the checkout at this root, as 'base'")
    ap.add_argument("--baseline-python", help="its interpreter (default: this one)")
    ap.add_argument("--callgrind", action="store_true", help="count instructions too (valgrind)")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    names = [n for n in args.pairs.split(",") if n]
    unknown = sorted(set(names) - set(PAIRS))
    if unknown:
        ap.error(f"unknown pairs: {', '.join(unknown)}")
    if args.chunks < (0 if args.child and not args.repeat else 1):
        ap.error("--chunks must be at least 1")
    if args.child:
        print(json.dumps(child(names, args.chunks, args.repeat)))
        return
    checkouts = [Checkout("head", ROOT, sys.executable)]
    if args.baseline_root:
        base = Checkout(
            "base", Path(args.baseline_root).resolve(), args.baseline_python or sys.executable
        )
        checkouts.insert(0, base)
    report: dict[str, Any] = {
        "chunks": args.chunks,
        "runs": args.runs,
        "repeat": args.repeat,
        "twproto": {c.name: where_twproto(c) for c in checkouts},
        "load_before": os.getloadavg(),
    }
    if args.callgrind:
        if shutil.which("valgrind") is None:
            ap.error("--callgrind needs valgrind (apt-get install valgrind)")
        print("counting instructions (callgrind)", flush=True)
        report["instructions_per_chunk"] = count_instructions(checkouts, names, args.chunks)
    print(f"timing {args.runs} rounds", flush=True)
    values = time_rounds(checkouts, names, args.chunks, args.runs, args.repeat)
    report["ns_per_chunk"] = summary(values, checkouts)
    report["ns_per_chunk_rounds"] = values
    report["load_after"] = os.getloadavg()
    print(table(report, checkouts))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
