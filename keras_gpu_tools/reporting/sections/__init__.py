"""The report's sections, one module per feature: what each gathers from the callbacks and from a
log directory, and its text, HTML, figures and badges (`keras_gpu_tools.reporting.section.Section`).
Their order in the report is that of `keras_gpu_tools.reporting.registry.SECTIONS`.
"""
