"""The profilers' own per-op totals grouped by Keras layer: what the layer table is checked against on a GPU.

- TensorFlow and JAX: xprof's ``hlo_stats`` tool (every HLO op's total self time on the device and its
  framework op name), each op's framework name matched to a layer path;
- torch: ``torch.profiler``'s own parse of a session (``prof.events()``): each kernel's device time
  (once, under the CPU op that launched it), to the ``keras_layer::`` range among that op's CPU
  parents, a backward op by its autograd sequence number to the layer of the forward op with that number;
  copies between host and device left out, as the table and xprof's per-op totals leave them.
"""

from __future__ import annotations

from keras_gpu_tools.profiling.layer_trace import TORCH_HOST_COPIES
from keras_gpu_tools.profiling.layers import OUTSIDE, Matcher, layer_tree, segments_of
from keras_gpu_tools.profiling.trace import tool_data


def xprof_layer_shares(model, xplane_files) -> dict[str, float]:
    """Each layer path's share of the device time, from xprof's per-HLO-op totals."""
    data = tool_data(xplane_files, "hlo_stats")
    table = data[0] if isinstance(data, list) else data
    cols = [c["id"] for c in table["cols"]]
    recs = [dict(zip(cols, [c.get("v") if isinstance(c, dict) else None for c in row["c"]])) for row in table["rows"]]
    matcher = Matcher(layer_tree(model), segments_of(str(r.get("tf_op_name") or "") for r in recs))
    totals: dict[str, float] = {}
    for rec in recs:
        path = matcher.match(str(rec.get("tf_op_name") or ""))[0] or OUTSIDE
        totals[path] = totals.get(path, 0.0) + float(rec.get("total_self_time") or 0.0)
    return _shares(totals)


def torch_layer_shares(model, run_steps, steps: int = 5) -> dict[str, float]:
    """Each layer path's share of the device time over ``run_steps(steps)``, as torch.profiler parses its session."""
    import torch

    from keras_gpu_tools import backends
    from keras_gpu_tools.profiling.layer_window import LayerTables

    tables = LayerTables()
    tables.start_fit(model)
    tables.start_window(backends.get("torch").profiler(), 0)
    try:
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            run_steps(steps)
            torch.cuda.synchronize()
    finally:
        tables.stop_window()
    events = list(prof.events())

    def layer_of(evt):
        while evt is not None:
            if evt.name.startswith("keras_layer::"):
                return evt.name[len("keras_layer::") :]
            evt = evt.cpu_parent
        return None

    forward = {e.sequence_nr: layer_of(e) for e in events if e.sequence_nr >= 0 and layer_of(e) is not None}
    totals: dict[str, float] = {}
    for e in events:
        # Each kernel once, under the CPU op that launched it (torch.profiler links them by correlation):
        # an op's self device time would count a kernel again as an event of its own, with no CPU parent.
        # Copies between host and device are no layer's work: the table keeps them apart too.
        t = float(sum(k.duration for k in getattr(e, "kernels", ()) or () if not k.name.startswith(TORCH_HOST_COPIES)))
        if t <= 0:
            continue
        path = layer_of(e)
        if path is None:
            up = e
            while up is not None and path is None:
                if up.sequence_nr >= 0 and not _in_forward_range(up):
                    path = forward.get(up.sequence_nr)
                up = up.cpu_parent
        key = path or OUTSIDE
        totals[key] = totals.get(key, 0.0) + t
    return _shares(totals)


def _in_forward_range(evt) -> bool:
    while evt is not None:
        if evt.name.startswith("keras_layer::"):
            return True
        evt = evt.cpu_parent
    return False


def _shares(totals: dict[str, float]) -> dict[str, float]:
    whole = sum(totals.values())
    return {k: v / whole for k, v in totals.items()} if whole else {}
