.PHONY: install test test-unit test-fleet test-slow bench lint clean

install:
	pip install -e '.[dev]'

test:
	python -m pytest -q

test-unit:
	python -m pytest -q tests/unit

test-fleet:
	python -m pytest -q tests/fleet

test-slow:
	python -m pytest -q -m slow

bench:
	python bench/next_id.py && python bench/decode.py && python bench/startup.py

clean:
	rm -rf .venv build dist .pytest_cache .hypothesis *.egg-info
