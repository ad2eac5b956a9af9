"""The host body: every block of every supported model in NumPy, f32 activations.

It is the reference the accelerated backends are checked against and the fallback for
every layer they refuse, so each block exists exactly once here.
"""
