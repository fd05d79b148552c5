"""The report's Markdown: title, claims count, sections with figures and tables."""

from __future__ import annotations

import pandas as pd

from poetlab.reproduction.report import Section, report_markdown


def test_report_markdown_has_claims_and_sections():
    claims = pd.DataFrame([{"key": "k", "claim": "c", "section": "Fig. 5", "paper": "1", "ours": "2", "verdict": "reproduced"}])
    text = report_markdown("T", "smoke", claims, [Section("Fig. 3", "what it shows", "figures/fig3.png", pd.DataFrame({"a": [1]}))])
    assert text.startswith("# T\n") and "Of 1 claims: 1 reproduced, 0 differ, 0 hold by construction." in text and "![Fig. 3](figures/fig3.png)" in text
