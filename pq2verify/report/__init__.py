"""Reports: one table model (report.table) rendered to the console, Markdown, HTML and JSON;
self-contained HTML pages (report.html); progress lines (report.progress); the error map of a
failing case (report.errormap)."""
