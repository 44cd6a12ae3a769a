"""loom's offline tools: everything that works on files, not on a run.

  trace            loom traces as Python objects, read, checked and written
                   through libloom (no parser here)
  snapshot         PyTorch memory-snapshot pickles, loaded safely
  snapshot_import  snapshot -> loom trace
  snapshot_export  loom trace -> snapshot pickle (pytorch.org/memory_viz)
  snapshot_cli     `loom import`, `loom export-snapshot`, snapshot arguments
  compare_plot     `loom compare --plot`
  demo, whatif     `loom demo`, `loom what-if`
  whatif_model     `loom what-if --model`: a model recorded on the CPU
  predict          every allocator on a recorded step, and the largest
                   micro-batch that fits a device (the API behind it)
  parallel_shapes  one rank of a multi-GPU job: --config, --tp, --pp,
                   --dp/--zero, --optimizer (config transform, ZeRO rewrite)
  peak_modules     which modules hold a step's peak; the step as a
                   memory_viz snapshot with module frames
  workdir_cli      `loom files`
  record_cpu       a training step on the CPU -> the trace of the CUDA
                   allocator's requests (`loom.record_cpu`)
  record_modules   the modules it marks (MoE blocks dynamic), its hooks
  record_markers   the recorder's marker events and watch hooks
  record_summary   counting and comparing recorded events
  fake_record      recording without arithmetic (FakeTensors): the
                   shared fake mode and what it emulates of CUDA
  cpu_autocast     CUDA's autocast policy on CPU autocast, while recording
  cpu_models       models by name (transformers configs), their training
                   steps and Megatron's pipeline orders
  record_cpu_cli   `loom record-cpu`
  forward          running loom_tool for the subcommands forwarded to it
  cli              the command line (`python3 -m loom`, `./loom`)

The run-time plugin (`import loom`) never imports this subpackage; loom's
export_snapshot, import_snapshot and record_cpu load it on first call.
Importing any module here does not import torch (the CPU recorder imports
torch and transformers when it runs).
"""
