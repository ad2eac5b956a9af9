"""`frink serve`: the OpenAI-compatible server (app.py) over the continuous-batching
engine (engine.py)."""
