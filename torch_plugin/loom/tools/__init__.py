"""loom's offline tools: everything that works on files, not on a run.

  trace            loom traces as Python objects, read, checked and written
                   through libloom (no parser here)
  snapshot         PyTorch memory-snapshot pickles, loaded safely
  snapshot_import  snapshot -> loom trace
  snapshot_export  loom trace -> snapshot pickle (pytorch.org/memory_viz)
  snapshot_cli     `loom import`, `loom export-snapshot`, snapshot arguments
  compare_plot     `loom compare --plot`
  demo, whatif     `loom demo`, `loom what-if`
  workdir_cli      `loom files`
  forward          running loom_tool for the subcommands forwarded to it
  cli              the command line (`python3 -m loom`, `./loom`)

The run-time plugin (`import loom`) never imports this subpackage; loom's
export_snapshot and import_snapshot load it on first call. Nothing here
imports torch.
"""
