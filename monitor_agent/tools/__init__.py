"""Command-line tools beside the server: the demo, its packaged GPT trainer, the HTML report.
"""
