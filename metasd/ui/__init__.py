"""The Gradio page of MetaSD Studio, below app.py (which only composes it and serves it).

    config      what the machine and the operator decide: concurrency, limits, defaults, examples
    session     per-session state: the stop registry and the record of a run
    bundles     the loaded presets, shared by every request, and the model's fair slots
    errors      what a user is told when a request is refused or fails
    files       the app's private temp dir: run logs and CSV downloads, size-checked uploads
    frames      the views one run draws (token view, figures, numbers), live or replayed
    generate    Generate tab handlers        compare     Compare tab handlers
    replay      Replay tab handlers          playground  Bandit playground handler
    text        the page's long texts (explanations, captions, the keyboard script)
    tabs        one builder function per tab: components and their event wiring
"""

import os

# The app never phones home: gradio reads this at import time, and every module here imports gradio.
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
