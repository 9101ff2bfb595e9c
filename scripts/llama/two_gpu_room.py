"""The two-GPU section's room tables for scripts/llama/two-gpu-report.py: per device the terms a
second GPU adds (replan.json's `devices`: mainline's compute buffer logged against the pipeline
model's, ik_llama.cpp's NCCL set-up against the NCCL term), and per out-of-memory case the
room terms (the one-device plan's, with the two-GPU terms, measured) and the plans again of
scripts/llama/two-gpu-replan.py. `rep` is two-gpu-report.py's namespace (its log parsing and
formatting helpers).
"""
import json


def replans(data) -> dict:
    """replan.json, which scripts/llama/two-gpu-replan.py writes beside the raw results."""
    f = data.folder / "replan.json"
    return json.loads(f.read_text()) if f.exists() else {}


def device_report(rep, again: dict, engine: str) -> list:
    """replan.json's per-device terms: mainline's compute buffer (logged, the pipeline model's),
    ik_llama.cpp's NCCL set-up (measured between two free-memory lines, the model's)."""
    devices = again.get("devices")
    if not devices:
        return []
    out = ["", f"<!-- two-gpus-devices-{engine}: begin (python3 scripts/llama/two-gpu-report.py DATA; "
           f"DATA/replan.json by scripts/llama/two-gpu-replan.py) -->"]
    if engine == "mainline":
        out += ["| run | device | layers | compute buffer (MiB): logged | pipeline model | logged − model |",
                "|---|---:|---|---:|---:|---:|"]
    else:
        out += ["| run | device | layers | NCCL communicators (MiB): measured | model |", "|---|---:|---|---:|---:|"]
    for name, r in devices.items():
        for d, x in sorted(r["devices"].items()):
            layers = f"{x['layers'][0]}–{x['layers'][-1]}" + (" + output" if x["output"] else "")
            if engine == "mainline":
                # both as llama.cpp prints a buffer: 4 decimals of MiB
                logged, model = x["compute_logged_mib"], f"{x['compute_model_bytes'] / rep.MIB:.4f}"
                gap = round(float(logged) - float(model), 4) + 0.0
                out.append(f"| {name} | {d} | {layers} | {logged} | {model} | {gap:+.4f} |")
            else:
                lo, hi = x["nccl_measured_mib"]
                out.append(f"| {name} | {d} | {layers} | {lo:,.1f}–{hi:,.1f} | {x['nccl_model_bytes'] / rep.MIB:,.1f} |")
    out.append(f"<!-- two-gpus-devices-{engine}: end -->")
    return out


def room_report(rep, data, runs: list, parsed: dict, engine: str) -> list:
    """Per out-of-memory case: the room terms, planned, modelled and measured; and, where
    two-gpu-replan.py has run, the plan again with the modelled and the measured terms, against
    the run."""
    again = replans(data)
    out = device_report(rep, again, engine)
    for never in (r for r in runs if "-oom-" in r["name"] and r["name"].endswith("-never")):
        p = parsed[never["name"]]
        base = never["name"][: -len("-never")]
        dev = int(p["oom"].group(1)) if p["oom"] else never.get("ballast_device")
        pn = rep.plan_json(data, never["name"], "never")
        terms = rep.room_terms(never, p, data.text(never["log"]), pn, dev) if pn else None
        if not terms:
            continue
        case = again.get("cases", {}).get(base)
        # the modelled terms (replan.json): the plan's with the terms a second GPU adds
        model = case["terms"].get("model", terms["plan"]) if case else terms["plan"]
        room_model = terms["free_mib"] - sum(model.values())
        out += ["", f"<!-- two-gpus-room-{engine}: begin (python3 scripts/llama/two-gpu-report.py DATA) -->",
                f"| {base}, device {dev}: {terms['free_mib']:,.0f} MiB free before start | one-device plan (MiB) | "
                "with the two-GPU terms (MiB) | measured (MiB) | measured − modelled |",
                "|---|---:|---:|---:|---:|"]
        for k, what in rep.TERMS:
            a, m, b = terms["plan"][k], model[k], terms["real"][k]
            out.append(f"| {what} | {rep.mib(a)} | {rep.mib(m)} | {rep.mib(b)} | {round(b - m, 1) + 0.0:+,.1f} |")
        out.append(f"| **the pool's room** | {rep.mib(terms['room_plan'])} | {rep.mib(room_model)} | {rep.mib(terms['room_real'])} | "
                   f"{round(terms['room_real'] - room_model, 1) + 0.0:+,.1f} |")
        out.append(f"<!-- two-gpus-room-{engine}: end -->")
        if not case:
            continue
        fix = next((r for r in runs if r["name"] == base + "-auto"), None)
        tok = rep.oom_token(never, p)
        fix_peak = parsed[fix["name"]]["stats"].get(dev, {}).get("reserved_bytes.all.peak") if fix else None
        out += ["", f"<!-- two-gpus-replan-{engine}: begin (python3 scripts/llama/two-gpu-report.py DATA; "
                f"DATA/replan.json by scripts/llama/two-gpu-replan.py) -->",
                "| `repro-prefill plan --free` | `legacy`/`never` | pool reserve when it runs out (MiB) | "
                "`legacy`/`auto` | its peak pool reserve (MiB) |",
                "|---|---|---:|---|---:|"]
        for row in case["plans"]:
            nv, au = row["never"], row["auto"]
            said = "completes" if nv["fits"] else f"dies at token {nv['oom_at_token']:,}"
            said_fix = "completes" if au["fits"] else f"dies at token {au['oom_at_token']:,}"
            out.append(f"| {row['free_gib']:.4f} GiB: {row['what']} | {said} | "
                       f"{rep.mib(nv['pool_peak_reserved_bytes'] / rep.MIB) if not nv['fits'] else '–'} | {said_fix} | "
                       f"{rep.mib(au['pool_peak_reserved_bytes'] / rep.MIB) if au['fits'] else '–'} |")
        real = f"dies at token {tok[0]:,}" if tok else rep.outcome(never, p)
        out.append(f"| the run ({terms['free_mib'] / 1024:.4f} GiB free) | {real} | {rep.mib(p['reserved_at_oom_mib'])} | "
                   f"{'completes' if fix and fix['rc'] == 0 else 'not run' if not fix else rep.outcome(fix, parsed[fix['name']])} | "
                   f"{rep.mib(fix_peak / rep.MIB if fix_peak is not None else None)} |")
        out.append(f"<!-- two-gpus-replan-{engine}: end -->")
    return out
