"""Leaderboards and reports from eval result files (docs/results-schema.md, docs/leaderboard.md).

- results_io: load / validate / merge result files; refuse mixed definitions or schema versions.
- leaderboard: rows, their order, speed ranks per hardware, speedup-model tables.
- speedup_model: predicted speedup at every k from per-position acceptance and measured costs.
- plots, html, markdown: pictures (matplotlib PNG), the static HTML page and README.md.
- cli_leaderboard / cli_report: `draftsmith leaderboard` and `draftsmith report`.
"""
