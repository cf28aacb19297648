"""Plots and the self-contained HTML report of slotscope runs.

Public API: ``reports.html.write_report(run_dir, out_path=None)``, ``reports.html.write_comparison(run_dirs,
out_path)``, ``reports.data.load_run(run_dir)`` and ``reports.commands.register(subparsers)`` (the
``report`` and ``compare`` subcommands). This module imports nothing heavy, so the CLI can register the
subcommands without loading matplotlib.
"""
