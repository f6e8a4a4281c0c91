"""What a run says: text and JSON reports, SARIF, and the generated pages of the documentation site."""
