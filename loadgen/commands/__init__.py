"""The ``slobench`` commands, one module per family; ``loadgen.cli`` parses the arguments and calls them.

``common`` (usage errors, exit codes, the run folder from the output flags), ``load_runs`` (run, replay),
``capacity``, ``results`` (summarize, report, gate), ``targets`` (serve, generate, mock-server),
``summary_table`` (the table a run prints).
"""
