"""Developer conveniences: the embedded sandbox and the demo."""
