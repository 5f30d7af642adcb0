"""The training report: what the callbacks measured, in one view (`keras_gpu_tools.report`).

Modules:

- `sections/`: one module per section (GPUs and host, GPU health, the job, step time, the input
  pipeline, the step breakdown, the batch plan, speed-ups, out of memory, memory over time,
  profiler windows, time per layer, mixed precision, training curves), each a `Section`
  (`section`): what it gathers from the callbacks and from a log directory, its text, HTML,
  figures and badges. `registry.SECTIONS` lists them, in the report's order.
- `model`: `ReportData`, the report's model of a run, and its `Series`.
- `from_callbacks`: gathering from live callbacks, a `History` or the model (`sources` says which is which).
- `from_logdir`: gathering from a TensorBoard log directory (read by `keras_gpu_tools.logdir.reader`
  into `logs.Logs`).
- `text`, `html`, `figures`: the page as plain text, as HTML, and its plots (drawn once); `markup`
  and `drawing` are the pieces the sections' HTML and plots share.
- `report`: the public `report()` and `TrainingReport`.

Sections: per GPU, utilization (SM activity where the GPU reports it) and memory over time; the
host's CPU and memory; step time split into input wait, compute and other; the input-bound verdict
and its advice; OOM recoveries; profiler windows and their xprof conclusion; mixed-precision
findings; the training curves Keras wrote. Nothing here imports Keras or a framework at import
time: matplotlib is imported when a figure is first drawn, TensorBoard's protos when a log
directory is read.

What is read (a missing one leaves its part of the report out):

| callback: records | log dir: run, tags |
|---|---|
| `GPUUtilizationLogger`: `device_records()`, `timeline` | `gpu`: scalars `gpu/<i>/*`, `host/*`; JSON `gpu/devices/data` |
| `InputBoundDetector`: `epoch_history`, `measurement`, `verdict`, `job_verdict` | `input`: scalars `input/*`, `throughput/*`; JSON `input/verdict/data` |
| `ProfilerWindow`: `captures`, `layer_table()` | `profile`: JSON `profile/steps_<first>_<last>/data`, `.../input_pipeline/data`, `.../layers/data` (the last window's) |
| `OOMBatchSizeReducer`: `events`, `micro_batches`, `recovery_seconds` | `oom`: scalars `oom/*`; JSON `oom/events/data` |
| `MixedPrecisionCheck`: `findings` | `report`: JSON `mixed_precision/findings/data` (`TrainingReport.write_to_tensorboard`) |
| `History` (or the model's) | `train`, `validation`: Keras's `epoch_*` |

An event file that cannot be read (not an event file, corrupt, cut short) is named in the report;
when none can be read, `report()` raises `ValueError`.

A log directory reused by a single-process fit and a job of several processes holds two trainings:
the report covers one (`layout`: the one written last by default, or `"single"`, `"job"`) and a
note names the runs it leaves out. Event files are streamed: each scalar tag is a bounded `Series`
(exact min, mean, max and last; at most `MAX_POINTS` evenly spaced points plotted, the plot says
so), so memory does not grow with the length of a run.

A log directory written by a job of several processes holds, per callback, one run per process
(`<run>/process_<p>`) and process 0's job-wide figures (`<run>/job`). The report shows the GPUs of
every process, everything else from the lowest process (0) alone, so nothing is counted twice, and
a table of the job-wide figures (`job/...` scalars). The job's input verdict (each process's step
time and input wait, the stragglers and the advice for them) comes from the `job` part of process
0's `input/verdict/data`, else from the text `input/job_verdict` of `input/job`. Each profiler
window of the job (`ProfilerWindow`'s `captures[i].job_*` on process 0, or `profile/job`'s
`profile/steps_<first>_<last>/data` and `.../input_pipeline/data`) is shown there too: the traces of every
process, each process's mean step time, the slowest, and xprof's conclusion over all the traces.
"""
