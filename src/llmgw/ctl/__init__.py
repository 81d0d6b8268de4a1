"""llmgw ctl: the operator's CLI (commands and --json shapes in docs/ctl.md).

main (argparse, lazy dispatch) → commands/* (one module per group) → client
(urllib, the one place controller errors become ctl errors) and render/tables
(pure: wire values in, text out), which show fleet data only through shown
(control and bidi characters visible, never markup). bench drives load with
aiohttp; capacity holds its pure decisions; streams wraps stdout and stderr so a
failed write (a pipe to head, a full disk) is a ctl error. Nothing heavy is imported
until a command runs.
"""
