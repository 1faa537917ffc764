.PHONY: install test test-slow bench lint clean

install:
	pip install -e '.[dev]'

test:
	python -m pytest -q

test-slow:
	python -m pytest -q -m slow

bench:
	python bench/next_id.py && python bench/decode.py

clean:
	rm -rf .venv build dist .pytest_cache .hypothesis *.egg-info
