"""Benchmark: tokens/s and peak memory against batch size and context length, teacher vs student,
from bench jobs; and a form that queues a new benchmark (it never runs in the UI process)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import bench_results, common
from app.charts import benchmark as charts
from app.charts.style import GIB, MEMORY_UNIT, RATIO_FORMAT
from core.config import BUNDLED_MODEL
from core.lists import comma_ints
from jobs import api
from jobs.errors import JobsError
from jobs.records import JobInfo

# contexts past the length where the teacher's KV cache outgrows the student's state (a few hundred tokens
# for the bundled model): where a converted model should win; repeats give a median, not one sample
DEFAULTS = {"batch_sizes": "1, 2, 4", "prompt_lengths": "512, 1024, 2048", "gen_length": 16, "repeats": 3}
HELP = {
    "batch_sizes": "Sequences decoded together, separated by commas. The teacher's KV cache grows with batch x "
                   "context; the student's state with the batch only.",
    "prompt_lengths": "Prompt tokens, separated by commas. Below a few hundred tokens the teacher's KV cache is "
                      "smaller than the student's state and softmax is cheap: the student wins at long contexts.",
    "gen_length": "Tokens decoded after each prompt: decode tokens/s is their median step.",
    "repeats": "Timed runs of each point; the page shows their median. One run on a busy machine is noise.",
}
MEMORY = f"peak memory ({MEMORY_UNIT})"  # the memory column of every table, in the charts' unit
FACTORS = ("batch_size", "context_length")  # what the charts are drawn against


def _ints(text: str, name: str) -> list[int]:
    values = comma_ints(text, name)
    if not values:
        raise ValueError(f"{name}: give at least one value")
    return values


def _launch_form(conversions: list[common.Conversion], expanded: bool) -> None:
    with st.expander("Run a benchmark", expanded=expanded, icon=":material/speed:"):
        st.caption("Measures prefill and decode speed and peak memory of the teacher and of a student with the same "
                   "conversion settings, side by side in one job (speed and memory do not depend on the trained "
                   "weights). It runs in the background like a conversion.")
        by_id = {c.key: c for c in conversions}
        options = [None, *by_id]
        source = st.selectbox("Model and attention settings", options, key="bench_source",
                              format_func=lambda i: "bundled SmolLM2-135M-Instruct, recipe attention" if i is None
                              else f"as {by_id[i].label}")
        c1, c2, c3, c4 = st.columns(4)
        batches = c1.text_input("Batch sizes", DEFAULTS["batch_sizes"], key="bench_batches", help=HELP["batch_sizes"])
        contexts = c2.text_input("Context lengths", DEFAULTS["prompt_lengths"], key="bench_contexts",
                                 help=HELP["prompt_lengths"])
        gen = c3.number_input("Generated tokens", min_value=2, value=DEFAULTS["gen_length"], key="bench_gen",
                              help=HELP["gen_length"])
        repeats = c4.number_input("Repeats", min_value=1, value=DEFAULTS["repeats"], key="bench_repeats",
                                  help=HELP["repeats"])
        _estimate(batches, contexts, int(gen), int(repeats))
        if st.button("Launch benchmark", type="primary", key="bench_submit", icon=":material/play_arrow:"):
            try:
                config = {"batch_sizes": _ints(batches, "batch sizes"),
                          "prompt_lengths": _ints(contexts, "context lengths"),
                          "gen_lengths": [int(gen)], "repeats": int(repeats)}
                if source is not None:
                    cfg = by_id[source].config
                    attn = cfg.get("attention", {})
                    config["model"] = cfg.get("model", {}).get("source", BUNDLED_MODEL)
                    config["dtype"] = cfg.get("model", {}).get("dtype", "float32")
                    config["attention"] = {"kind": attn.get("kind", "terraced"),
                                           "feature_map": attn.get("feature_map", "hedgehog"),
                                           "feature_dim": attn.get("feature_dim", 64),
                                           "window_size": attn.get("window_size", 64),
                                           "softmax_layers": common.softmax_layers(by_id[source])}
                name = f"bench-{by_id[source].tag}" if source is not None else "bench"
                job = api.submit_job(common.BENCH, config, name=name, **common.ws())
            except (JobsError, ValueError) as exc:
                st.error(str(exc), icon=":material/error:")
            else:
                st.session_state["bench_job"] = job.id
                st.session_state["flash"] = f"Queued bench job #{job.id}."
                st.rerun()


def _tokens(batches: list[int], contexts: list[int], gen: int, repeats: int, sweep: str = "axes") -> int:
    """Tokens a benchmark processes per model, prompt and generated, each repeat, over its points: one
    factor at a time around the first values (``core.bench.config.BenchConfig``'s ``axes``), or every
    pair (``grid``)."""
    points = ({(b, c) for b in batches for c in contexts} if sweep == "grid"
              else {(b, contexts[0]) for b in batches} | {(batches[0], c) for c in contexts})
    return sum(b * (length + gen) for b, length in points) * repeats


def _estimate(batches: str, contexts: str, gen: int, repeats: int) -> None:
    """About how long the benchmark takes: the tokens it processes at the pace of the last finished
    benchmark (its wall time over its own tokens), or why there is no estimate."""
    try:
        tokens = _tokens(_ints(batches, "batch sizes"), _ints(contexts, "context lengths"), gen, repeats)
    except ValueError:
        return  # the launch button says what is wrong
    for job in common.list_jobs(kind=common.BENCH, status="succeeded"):
        cfg = job.config
        if not (job.started_at and job.finished_at and cfg.get("batch_sizes") and cfg.get("prompt_lengths")):
            continue
        done = _tokens(cfg["batch_sizes"], cfg["prompt_lengths"], max(cfg.get("gen_lengths") or [0]),
                       cfg.get("repeats") or 1, cfg.get("sweep") or "axes")
        seconds = (job.finished_at - job.started_at).total_seconds() * tokens / max(done, 1)
        st.caption(f"About {common.fmt_duration(seconds)}: {tokens:,} tokens a model, at the pace of bench job "
                   f"#{job.id} ({common.fmt_duration((job.finished_at - job.started_at).total_seconds())} for "
                   f"{done:,}; longer contexts cost the teacher more than their share).")
        return
    st.caption(f"{tokens:,} tokens a model. No finished benchmark to time it by yet: a first small one (batch 1, "
               "contexts 512, 1 repeat) takes a few minutes with the bundled model on CPU.")


def _points_table(points: list[dict]) -> pd.DataFrame:
    rows = []
    for p in points:
        rows.append({"model": p["model"], "batch": p["batch_size"], "context": p["context_length"],
                     "generated": p["gen_length"], "status": p["status"],
                     "tokens/s": p["tokens_per_second"], "decode tok/s": p["decode_tokens_per_second"],
                     "prefill tok/s": p["prefill_tokens_per_second"],
                     MEMORY: p["peak_memory_bytes"] / GIB if p["peak_memory_bytes"] else None})
    return pd.DataFrame(rows)


FLOOR_COLUMNS = {"prefill_speedup": "prefill student / teacher", "floor_prefill_speedup": "prefill floor / teacher",
                 "prefill_vs_floor": "prefill student / floor", "decode_speedup": "decode student / teacher",
                 "floor_decode_speedup": "decode floor / teacher", "decode_vs_floor": "decode student / floor"}


def _floor_table(report: dict) -> pd.DataFrame:
    """One row per point of the report's ``comparisons`` that include the floor (empty without it)."""
    rows = report.get("comparisons") if isinstance(report, dict) else None
    rows = [c for c in rows if isinstance(c, dict) and all(k in c for k in FLOOR_COLUMNS)] if isinstance(rows, list) else []
    return pd.DataFrame([{"batch": c.get("batch_size"), "context": c.get("prompt_length"),
                          **{label: c[key] for key, label in FLOOR_COLUMNS.items()}} for c in rows])


def _capacity(capacity: dict) -> None:
    """The capacity run: throughput and memory against batch size with the budget, and the largest batches."""
    st.subheader(f"Capacity under {capacity.get('memory_budget', 'a memory budget')}")
    st.caption("The largest batch whose measured decode peak fits the budget, per model, and the decode throughput "
               "there. " + str(capacity.get("method", "")))
    st.plotly_chart(charts.capacity_figure(capacity), key="bench_capacity")
    rows = [{"context": c.get("prompt_length"), "model": model, "largest batch": found.get("largest_batch"),
             "decode tok/s": found.get("decode_tokens_per_second"),
             MEMORY: (found.get("peak_memory_bytes") or 0) / GIB or None}
            for c in capacity.get("contexts", []) for model, found in c.get("models", {}).items()]
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch",
                 column_config={"decode tok/s": st.column_config.NumberColumn(format="%.2f"),
                                MEMORY: st.column_config.NumberColumn(format="%.3f")})


def _single_factors(points: list[dict]) -> None:
    """Why a chart against batch size or context length is missing: every point has the same value."""
    for x in FACTORS:
        if not charts.varies(points, x):
            st.caption(f"No chart against {charts.FACTORS[x]}: every point of this benchmark has {charts.FACTORS[x]} "
                       f"{points[0][x]}, and a chart against it needs two values or more.")


def _charts(job: JobInfo, report: dict) -> None:
    capacity = report.get("capacity") if isinstance(report, dict) else None
    if isinstance(capacity, dict) and capacity.get("contexts"):
        _capacity(capacity)
    points = bench_results.normalise(report)
    if not points and isinstance(capacity, dict):
        return
    if not points:
        st.warning(f"The report of job #{job.id} holds no benchmark points this page can read.")
        with st.expander("Raw report"):
            st.json(report, expanded=False)
        return
    ooms = [p for p in points if p["status"] == "oom"]
    if ooms:
        st.warning("Out of memory at: " + ", ".join(
            f"{p['model']} batch {p['batch_size']} context {p['context_length']}" for p in ooms))
    busy = bench_results.contention_warning(report)
    if busy:
        st.warning(busy, icon=":material/speed:")
    note = bench_results.timing_note(report)
    if note:
        st.caption(note)
    native = bench_results.native_figures(report)
    if native:
        for name, fig in native.items():
            if name == "capacity":  # drawn above
                continue
            st.plotly_chart(fig, key=f"bench_native_{name}")
    else:
        for x in [x for x in FACTORS if charts.varies(points, x)]:
            c1, c2 = st.columns(2)
            c1.plotly_chart(charts.throughput_figure(points, x, "tokens_per_second"), key=f"bench_tps_{x}")
            c2.plotly_chart(charts.throughput_figure(points, x, "peak_memory_bytes"), key=f"bench_mem_{x}")
            c3, c4 = st.columns(2)
            c3.plotly_chart(charts.throughput_figure(points, x, "decode_tokens_per_second"), key=f"bench_dec_{x}")
            c4.plotly_chart(charts.throughput_figure(points, x, "prefill_tokens_per_second"), key=f"bench_pre_{x}")
    _single_factors(points)
    st.dataframe(_points_table(points), hide_index=True, width="stretch",
                 column_config={**{c: st.column_config.NumberColumn(format="%.1f")
                                   for c in ("tokens/s", "decode tok/s", "prefill tok/s")},
                                MEMORY: st.column_config.NumberColumn(format="%.3f")})
    gaps = _floor_table(report)
    if not gaps.empty:
        st.caption("The floor is the teacher with an attention that costs nothing (it returns zeros): the speed any "
                   "attention replacement is bounded by. floor / teacher is that limit; student / floor how close the "
                   "student gets to it.")
        st.dataframe(gaps, hide_index=True, width="stretch",
                     column_config={c: st.column_config.NumberColumn(format=f"%{RATIO_FORMAT}")
                                    for c in FLOOR_COLUMNS.values()})


def _served() -> None:
    """The committed measurement of teacher and student served by vLLM, when the project holds one."""
    result = bench_results.served_result()
    if result is None:
        return
    setup = result["setup"]
    with st.expander("Served by vLLM: teacher and student in one engine, one cache budget"):
        st.caption(f"Each request: {setup['prompt_len']} prompt tokens, then {setup['max_tokens']} generated; both "
                   f"models in vLLM with a cache of {setup['cache_bytes'] / GIB:.2f} GiB, which holds "
                   f"{result['capacity']['teacher']:.1f} of the teacher's requests and "
                   f"{result['capacity']['student']:.1f} of the student's. Measured by "
                   "`benchmarks/serving_throughput.py` on this project's CPU machine "
                   f"({setup['cpu_count']} cores); rerun it to measure yours.")
        st.plotly_chart(charts.served_figure(result), key="bench_served")
        table = pd.DataFrame([{"requests": p["requests"], "teacher tokens/s": p["teacher_tokens_per_s"],
                               "student tokens/s": p["student_tokens_per_s"], "student / teacher": p["ratio"],
                               "teacher at once": p["teacher_in_flight"], "student at once": p["student_in_flight"]}
                              for p in result["points"]])
        st.dataframe(table, hide_index=True, width="stretch",
                     column_config={**{c: st.column_config.NumberColumn(format="%.1f")
                                       for c in ("teacher tokens/s", "student tokens/s")},
                                    "student / teacher": st.column_config.NumberColumn(format=f"%{RATIO_FORMAT}")})


def _job_view(job_id: int) -> None:
    job = api.get_job(job_id, **common.ws())
    if job.status in common.ACTIVE:
        frac = common.progress_fraction(job) or 0.0
        st.progress(frac, text=f"{job.status}: point {job.progress_step or 0}/{job.progress_total or '?'}")
        return
    if job.status != "succeeded":
        st.error(f"Job #{job.id} {job.status}" + (f": {job.error}" if job.error else
                                                  (f": {job.status_reason}" if job.status_reason else "")))
        return
    report = common.report(job)
    if report is None:
        st.warning(f"Job #{job.id} succeeded but left no report.")
        return
    _charts(job, report)


def _jobs(jobs: list[JobInfo]) -> None:
    """The picked benchmark job's charts (live while it runs)."""
    by_id = {j.id: j for j in jobs}
    if st.session_state.get("bench_job") not in by_id:
        done = [j.id for j in jobs if j.status == "succeeded"]
        st.session_state["bench_job"] = done[0] if done else jobs[0].id
    job_id = st.selectbox("Benchmark", list(by_id), key="bench_job", format_func=lambda i: common.job_label(by_id[i]))
    if by_id[job_id].status in common.ACTIVE:
        st.fragment(run_every=common.REFRESH_S)(_job_view)(job_id)
    else:
        _job_view(job_id)


def main() -> None:
    st.title("Benchmark")
    common.show_flash()
    st.caption("Tokens per second and peak memory of the teacher (softmax attention, KV cache) and the student "
               "(LoLCATs attention, constant-size state) across batch sizes and context lengths.")
    jobs = common.list_jobs(kind=common.BENCH)
    _launch_form(common.conversions(), expanded=not jobs)
    if jobs:
        _jobs(jobs)
    else:
        st.info("No benchmark yet: launch one above. The charts appear here when it finishes.")
    _served()


main()
