"""The docs run's report: after the pages, every block it left out, with the page, line and why."""

from __future__ import annotations

from support.docs_blocks import SKIPS, page_blocks, pages


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if config.getoption("markexpr") != "docs":  # only the docs run itself (make test-docs)
        return
    skipped = [b for page in pages() for b in page_blocks(page) if b.skip]
    terminalreporter.section(f"docs blocks not run ({len(skipped)})")
    for block in skipped:
        note = f" ({block.note})" if block.note else ""
        terminalreporter.write_line(f"{block.where}: {block.skip}{note}: {SKIPS[block.skip]}")
