"""The comparison's report: the results document to markdown tables and PNG charts.

``markdown(doc)`` is pure (a results document in, text out). ``charts(doc, out_dir)`` draws
with matplotlib's Agg backend and returns the files it wrote; without matplotlib it draws
nothing and says so, so the harness still runs where only the test extras are installed.

The results document (``results.json``) holds ``machine``, ``settings``, ``peers`` (label,
version, client, configuration, or why it was skipped), ``results`` (one entry per
measurement: peer, workload, value_bytes, partitions, figures) and ``errors``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

WORKLOAD_TITLES = {
    "produce": "Produce throughput, durable acknowledgement (records/s, MB/s)",
    "consume": "Consume throughput from the start (records/s, MB/s)",
    "latency": "Produce latency, one acknowledged record at a time (ms)",
    "end_to_end": "End-to-end latency, send to a waiting consumer (ms)",
}


def _size_label(value_bytes: int) -> str:
    return f"{value_bytes // 1024} KiB" if value_bytes % 1024 == 0 else f"{value_bytes} B"


def _find(doc: dict[str, Any], **match: Any) -> list[dict[str, Any]]:
    return [
        entry
        for entry in doc["results"]
        if all(entry.get(key) == value for key, value in match.items())
    ]


def _peers_in_order(doc: dict[str, Any]) -> list[str]:
    return [name for name, peer in doc["peers"].items() if not peer.get("skipped")]


def _table(header: list[str], rows: Iterable[list[str]], align: list[str]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return lines


def _throughput_table(doc: dict[str, Any], kind: str) -> list[str]:
    sizes = doc["settings"]["value_sizes"]
    header = ["peer"]
    for size in sizes:
        header += [f"{_size_label(size)} records/s", f"{_size_label(size)} MB/s"]
    rows = []
    for name in _peers_in_order(doc):
        row = [doc["peers"][name]["label"]]
        for size in sizes:
            found = _find(doc, peer=name, workload=kind, value_bytes=size, partitions=1)
            if found:
                figures = found[0]["figures"]
                row += [f"{figures['records_per_s']:,}", f"{figures['mb_per_s']:,.1f}"]
            else:
                row += ["-", "-"]
        if _find(doc, peer=name, workload=kind):
            rows.append(row)
    return _table(header, rows, ["---"] + ["---:"] * (len(header) - 1))


def _bare_fetch_lines(doc: dict[str, Any]) -> list[str]:
    """Tidelog's consume beside a bare ``FetchStream`` of the same records (same run)."""
    rows = []
    for entry in _find(doc, peer="tidelog", workload="consume"):
        bare = entry["figures"].get("bare_fetch_stream")
        if not bare:
            continue
        figures = entry["figures"]
        rows.append(
            [
                _size_label(entry["value_bytes"]),
                f"{figures['mb_per_s']:,.1f}",
                f"{bare['mb_per_s']:,.1f}",
                f"{bare['wire_mb_per_s']:,.1f}",
                f"{figures['mb_per_s'] / bare['mb_per_s']:.2f}",
            ]
        )
    if not rows:
        return []
    return [
        "Tidelog's consumer against a bare `FetchStream` of the same records right after it "
        "(the generated stub alone, one fetch at a time, nothing decoded): the transport's "
        "ceiling for this client.",
        "",
        *_table(
            ["value", "consumer MB/s", "bare FetchStream MB/s", "its wire MB/s", "ratio"],
            rows,
            ["---", "---:", "---:", "---:", "---:"],
        ),
        "",
    ]


def _latency_table(doc: dict[str, Any], kind: str) -> list[str]:
    sizes = doc["settings"]["value_sizes"]
    header = ["peer"]
    for size in sizes:
        header += [f"{_size_label(size)} p50", "p99", "p99.9"]
    rows = []
    for name in _peers_in_order(doc):
        row = [doc["peers"][name]["label"]]
        for size in sizes:
            found = _find(doc, peer=name, workload=kind, value_bytes=size)
            if found:
                figures = found[0]["figures"]
                row += [f"{figures[key]:.3f}" for key in ("p50_ms", "p99_ms", "p999_ms")]
            else:
                row += ["-", "-", "-"]
        if _find(doc, peer=name, workload=kind):
            rows.append(row)
    return _table(header, rows, ["---"] + ["---:"] * (len(header) - 1))


def _cpu_table(doc: dict[str, Any]) -> list[str]:
    """CPU seconds per million records, client and server, of the throughput runs."""
    rows = []
    for name in _peers_in_order(doc):
        for kind in ("produce", "consume"):
            for size in doc["settings"]["value_sizes"]:
                found = _find(doc, peer=name, workload=kind, value_bytes=size, partitions=1)
                if not found or "server_cpu_s" not in found[0]["figures"]:
                    continue
                figures = found[0]["figures"]
                per_million = 1e6 / figures["records"]
                rows.append(
                    [
                        doc["peers"][name]["label"],
                        kind,
                        _size_label(size),
                        f"{figures['seconds'] * per_million:.1f}",
                        f"{figures['client_cpu_s'] * per_million:.1f}",
                        f"{figures['server_cpu_s'] * per_million:.1f}",
                    ]
                )
    if not rows:
        return []
    return [
        "### Where the time goes: seconds per million records (wall, client CPU, server CPU)",
        "",
        "CPU includes every thread of the process; on 2 cores, client + server CPU close to "
        "2x wall means both cores were busy.",
        "",
        *_table(
            ["peer", "workload", "value", "wall s", "client CPU s", "server CPU s"],
            rows,
            ["---", "---", "---:", "---:", "---:", "---:"],
        ),
        "",
    ]


def _partitions_table(doc: dict[str, Any]) -> list[str]:
    entries = _find(doc, peer="tidelog", workload="partitions")
    if not entries:
        return []
    rows = []
    for entry in sorted(entries, key=lambda e: e["partitions"]):
        produce = entry["figures"]["produce"]
        consume = entry["figures"]["consume"]
        rows.append(
            [
                str(entry["partitions"]),
                f"{produce['records_per_s']:,}",
                f"{produce['mb_per_s']:,.1f}",
                f"{consume['records_per_s']:,}",
                f"{consume['mb_per_s']:,.1f}",
            ]
        )
    size = _size_label(entries[0]["value_bytes"])
    return [
        f"### Tidelog with 1, 4 and 16 partitions ({size} values, keyed, murmur2 per key)",
        "",
        *_table(
            ["partitions", "produce records/s", "produce MB/s", "consume records/s", "MB/s"],
            rows,
            ["---:"] * 5,
        ),
        "",
    ]


def backlog_summary(points: list[dict[str, Any]]) -> dict[str, Any]:
    """The append rate (MB/s) across backlog steps: medians (all, first and second half of
    the backlog), first, last, min, max and last/first."""
    rates = [point["mb_per_s"] for point in points]
    half = len(rates) // 2
    summary = {
        "steps": len(rates),
        "median_mb_per_s": round(statistics.median(rates), 1),
        "first_half_median_mb_per_s": round(statistics.median(rates[:half] or rates), 1),
        "second_half_median_mb_per_s": round(statistics.median(rates[half:]), 1),
        "first_mb_per_s": rates[0],
        "last_mb_per_s": rates[-1],
        "min_mb_per_s": min(rates),
        "max_mb_per_s": max(rates),
        "last_over_first": round(rates[-1] / rates[0], 2) if rates[0] else None,
    }
    for name in ("server_cpu_s_per_gb", "server_user_s_per_gb", "server_system_s_per_gb"):
        costs = [point[name] for point in points if name in point]
        if len(costs) == len(rates):
            summary[f"{name}_first_half_median"] = round(
                statistics.median(costs[:half] or costs), 2
            )
            summary[f"{name}_second_half_median"] = round(statistics.median(costs[half:]), 2)
    ratios = [point["over_plain"] for point in points if "over_plain" in point]
    if len(ratios) == len(rates):  # runs before the plain-file baseline have none
        summary["over_plain_median"] = round(statistics.median(ratios), 2)
        summary["over_plain_first_half_median"] = round(
            statistics.median(ratios[:half] or ratios), 2
        )
        summary["over_plain_second_half_median"] = round(statistics.median(ratios[half:]), 2)
    return summary


def _cpu_cell(point: dict[str, Any]) -> str:
    if "server_user_s_per_gb" in point:
        return f"{point['server_user_s_per_gb']:.2f} + {point['server_system_s_per_gb']:.2f}"
    if "server_cpu_s_per_gb" in point:
        return f"{point['server_cpu_s_per_gb']:.2f}"
    return "-"


def _backlog_section(doc: dict[str, Any]) -> list[str]:
    entries = _find(doc, peer="tidelog", workload="backlog")
    if not entries:
        return []
    entry = entries[0]
    points = entry["figures"]["steps"]
    summary = backlog_summary(points)
    total_gb = sum(p["records"] for p in points) * (16 + entry["value_bytes"]) / 1e9
    rows = [
        [
            f"{point['backlog_bytes_before'] / 1e9:.2f}",
            f"{point['records_per_s']:,}",
            f"{point['mb_per_s']:,.1f}",
            f"{point['plain_mb_per_s']:,.1f}" if "plain_mb_per_s" in point else "-",
            f"{point['over_plain']:.2f}" if "over_plain" in point else "-",
            _cpu_cell(point),
            str(point.get("loadavg_1m", "-")),
        ]
        for point in points
    ]
    baseline = ""
    if "over_plain_median" in summary:
        baseline = (
            " Next to each step, the same bytes appended to a plain file in the same file "
            "system, 256 KiB writes each followed by fsync (the disk's own rate at that "
            "point), and Tidelog's rate over it: median "
            f"{summary['over_plain_median']}, first half "
            f"{summary['over_plain_first_half_median']}, second half "
            f"{summary['over_plain_second_half_median']}."
        )
    if "server_user_s_per_gb_first_half_median" in summary:
        baseline += (
            " The broker's CPU time per GB appended, user (its own code) + system (the "
            "kernel's writing, which follows the disk): median "
            f"{summary['server_user_s_per_gb_first_half_median']} + "
            f"{summary['server_system_s_per_gb_first_half_median']} s over the first half, "
            f"{summary['server_user_s_per_gb_second_half_median']} + "
            f"{summary['server_system_s_per_gb_second_half_median']} s over the second."
        )
    elif "server_cpu_s_per_gb_first_half_median" in summary:
        baseline += (
            " The broker's CPU time per GB appended: median "
            f"{summary['server_cpu_s_per_gb_first_half_median']} s over the first half, "
            f"{summary['server_cpu_s_per_gb_second_half_median']} s over the second."
        )
    return [
        f"### Tidelog append rate as the retained backlog grows ({total_gb:.2f} GB written, "
        f"{_size_label(entry['value_bytes'])} values, acks=all)",
        "",
        f"{summary['steps']} steps: median {summary['median_mb_per_s']} MB/s; median of the "
        f"first half {summary['first_half_median_mb_per_s']} MB/s, of the second half "
        f"{summary['second_half_median_mb_per_s']} MB/s; first {summary['first_mb_per_s']}, "
        f"last {summary['last_mb_per_s']}, min {summary['min_mb_per_s']}, max "
        f"{summary['max_mb_per_s']} MB/s.{baseline} The 1-minute load average of the shared "
        "machine is shown for each step.",
        "",
        *_table(
            [
                "backlog before the step, GB",
                "records/s",
                "MB/s",
                "plain file MB/s",
                "Tidelog / plain",
                "broker CPU s/GB (user + system)",
                "load avg (1 min)",
            ],
            rows,
            ["---:"] * 7,
        ),
        "",
    ]


def markdown(doc: dict[str, Any]) -> str:
    """The results document as a markdown page: machine, peers, one table per workload."""
    machine = doc["machine"]
    settings = doc["settings"]
    lines = [
        "# Tidelog against its peers: results",
        "",
        f"Generated {doc['created_utc']} by `{doc['command']}`"
        + (" (**--quick**: smoke-check sizes, not comparable figures)" if doc["quick"] else "")
        + ".",
        "",
        *[f"Note: {note}\n" for note in doc.get("notes", [])],
        f"Machine: {machine['cpu_count']} CPUs ({machine['cpu_model']}), "
        f"{machine['memory_gib']} GiB, Linux {machine['kernel']}, Python "
        f"{machine['python']}; load average {machine['loadavg_start']} at the start, "
        f"{machine.get('loadavg_end', '?')} at the end. {machine['note']}",
        "",
        f"Workload: {settings['records']:,} records a throughput run, 16-byte unique keys, "
        f"values of {', '.join(_size_label(s) for s in settings['value_sizes'])} "
        f"(random bytes); {settings['samples']:,} samples a latency run (after "
        f"{settings['warmup']} warm-up records). Every server on 127.0.0.1, every client in "
        "Python in a process of its own.",
        "",
        "## Peers",
        "",
    ]
    for peer in doc["peers"].values():
        if peer.get("skipped"):
            lines.append(f"- **{peer['label']}**: skipped: {peer['skipped']}")
            continue
        lines.append(f"- **{peer['label']}** ({peer['version']}; client {peer['client']})")
        lines.extend(f"  - {key}: {text}" for key, text in peer["configuration"].items())
    lines.append("")
    lines.append("## Results")
    lines.append("")
    for kind in ("produce", "consume"):
        if _find(doc, workload=kind):
            lines += [f"### {WORKLOAD_TITLES[kind]}", "", *_throughput_table(doc, kind), ""]
    lines += _bare_fetch_lines(doc)
    for kind in ("latency", "end_to_end"):
        if _find(doc, workload=kind):
            lines += [f"### {WORKLOAD_TITLES[kind]}", "", *_latency_table(doc, kind), ""]
    floor = doc.get("reference", {}).get("grpc_floor")
    if floor:
        lines += [
            "Tidelog's transport floor, measured in the same run: a bare grpcio round trip "
            "(Python client and server, 200-byte message, no Tidelog) p50 "
            f"{floor['grpc_roundtrip_p50_ms']:.3f} ms, p99 {floor['grpc_roundtrip_p99_ms']:.3f}"
            f" ms; one message on an open stream p50 "
            f"{floor['grpc_stream_roundtrip_p50_ms']:.3f} ms.",
            "",
        ]
    lines += _cpu_table(doc)
    lines += _partitions_table(doc)
    lines += _backlog_section(doc)
    if doc["errors"]:
        lines += ["## Errors", ""]
        lines += [
            f"- {e['peer']} {e['workload']} {e.get('value_bytes', '')}: {e['error']}"
            for e in doc["errors"]
        ]
        lines.append("")
    if doc.get("charts"):
        lines += ["## Charts", ""]
        lines += [f"![{Path(chart).stem}]({Path(chart).name})" for chart in doc["charts"]]
        lines.append("")
    return "\n".join(lines)


# --- charts ---------------------------------------------------------------------------------


def charts(doc: dict[str, Any], out_dir: Path) -> list[Path]:
    """Draw the PNG charts into ``out_dir``; returns their paths (none without matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    all_peers = _peers_in_order(doc)
    sizes = doc["settings"]["value_sizes"]
    suffix = " (--quick)" if doc["quick"] else ""

    if _find(doc, workload="produce") or _find(doc, workload="consume"):
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
        for ax, kind in zip(axes, ("produce", "consume"), strict=True):
            peers = [name for name in all_peers if _find(doc, peer=name, workload=kind)]
            labels = [_short_label(doc, name) for name in peers]
            width = 0.8 / max(1, len(sizes))
            for s_index, size in enumerate(sizes):
                values = []
                for name in peers:
                    found = _find(doc, peer=name, workload=kind, value_bytes=size, partitions=1)
                    values.append(found[0]["figures"]["records_per_s"] if found else 0)
                xs = [i + s_index * width for i in range(len(peers))]
                bars = ax.bar(xs, values, width, label=f"{_size_label(size)} values")
                ax.bar_label(bars, labels=[f"{v / 1000:.0f}k" for v in values], fontsize=8)
            ax.set_xticks([i + width * (len(sizes) - 1) / 2 for i in range(len(peers))])
            ax.set_xticklabels(labels)
            ax.set_ylabel("records/s")
            ax.set_title(f"{kind}{suffix}")
            ax.legend(fontsize=8)
        fig.suptitle("Throughput: durable produce and consume from the start, 1 partition")
        fig.tight_layout()
        written.append(_save(fig, out_dir / "throughput.png", plt))

    if _find(doc, workload="latency") or _find(doc, workload="end_to_end"):
        fig, axes = plt.subplots(1, 2, figsize=(15, 5))
        for ax, kind in zip(axes, ("latency", "end_to_end"), strict=True):
            keys = ("p50_ms", "p99_ms", "p999_ms")
            groups = [(name, size) for name in all_peers for size in sizes]
            width = 0.8 / len(keys)
            for k_index, key in enumerate(keys):
                values = []
                for name, size in groups:
                    found = _find(doc, peer=name, workload=kind, value_bytes=size)
                    values.append(found[0]["figures"][key] if found else 0)
                xs = [i + k_index * width for i in range(len(groups))]
                ax.bar(xs, values, width, label=key.replace("_ms", "").replace("p999", "p99.9"))
            ax.set_xticks([i + width for i in range(len(groups))])
            ax.set_xticklabels(
                [f"{_short_label(doc, n)}\n{_size_label(s)}" for n, s in groups], fontsize=7
            )
            ax.set_yscale("log")
            ax.set_ylabel("ms (log scale)")
            title = "produce, one acked record" if kind == "latency" else "end to end"
            ax.set_title(f"{title}{suffix}")
            ax.legend(fontsize=8)
        fig.suptitle("Latency percentiles")
        fig.tight_layout()
        written.append(_save(fig, out_dir / "latency.png", plt))

    backlog = _find(doc, peer="tidelog", workload="backlog")
    if backlog:
        points = backlog[0]["figures"]["steps"]
        fig, ax = plt.subplots(figsize=(8, 4))
        xs = [
            (p["backlog_bytes_before"] + p["records"] * (16 + backlog[0]["value_bytes"])) / 1e9
            for p in points
        ]
        ax.plot(xs, [p["mb_per_s"] for p in points], marker="o", label="Tidelog append, acks=all")
        if all("plain_mb_per_s" in p for p in points):
            ax.plot(
                xs,
                [p["plain_mb_per_s"] for p in points],
                marker="s",
                linestyle=":",
                color="gray",
                label="plain file, 256 KiB writes + fsync (the disk)",
            )
        if all("server_user_s_per_gb" in p for p in points):
            cost_ax = ax.twinx()
            cost_ax.plot(
                xs,
                [p["server_user_s_per_gb"] for p in points],
                color="tab:green",
                marker="^",
                label="broker user CPU s per GB",
            )
            cost_ax.plot(
                xs,
                [p["server_system_s_per_gb"] for p in points],
                color="tab:olive",
                marker="v",
                linestyle="--",
                label="broker system CPU s per GB",
            )
            # A quick run's steps are too short for the kernel's CPU clock (10 ms): zero.
            top = max(max(p["server_user_s_per_gb"], p["server_system_s_per_gb"]) for p in points)
            cost_ax.set_ylim(0, top * 1.5 or 1.0)
            cost_ax.set_ylabel("broker CPU s / GB", color="tab:green")
            cost_ax.legend(fontsize=8, loc="upper right")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8, loc="lower left")
        ax.set_xlabel("retained log, GB")
        ax.set_ylabel("append MB/s")
        ax.set_title(f"Tidelog append rate as the backlog grows{suffix}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        written.append(_save(fig, out_dir / "backlog.png", plt))

    partitions = sorted(
        _find(doc, peer="tidelog", workload="partitions"), key=lambda e: e["partitions"]
    )
    if partitions:
        fig, ax = plt.subplots(figsize=(7, 4))
        counts = [str(e["partitions"]) for e in partitions]
        width = 0.4
        for index, kind in enumerate(("produce", "consume")):
            values = [e["figures"][kind]["records_per_s"] for e in partitions]
            bars = ax.bar(
                [i + index * width for i in range(len(counts))], values, width, label=kind
            )
            ax.bar_label(bars, labels=[f"{v / 1000:.0f}k" for v in values], fontsize=8)
        ax.set_xticks([i + width / 2 for i in range(len(counts))])
        ax.set_xticklabels(counts)
        ax.set_xlabel("partitions")
        ax.set_ylabel("records/s")
        ax.set_title(f"Tidelog throughput by partition count{suffix}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(_save(fig, out_dir / "partitions.png", plt))
    return written


def _short_label(doc: dict[str, Any], name: str) -> str:
    """A peer's label broken onto lines, so bar groups' tick labels do not collide."""
    label: str = doc["peers"][name]["label"]
    return label.replace(" ", "\n", 1)


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
