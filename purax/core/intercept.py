"""Moved to :mod:`purax.inspect.intercept` in 0.3; this import path goes in 0.4."""

from purax.core import lazy

lazy.moved(__name__, 'purax.inspect.intercept', until='0.4')
