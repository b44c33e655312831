"""Show: plotly figures (``plots``), ipywidgets panels (``widgets``), export for papers (``export``).
Nothing here computes science."""
