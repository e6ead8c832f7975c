"""purax.io: data sets, grain pipelines, device prefetch, metric writers, checkpoints."""

from purax.io import checkpoint as checkpoint
from purax.io import datasets as datasets
from purax.io import pipeline as pipeline
from purax.io import writers as writers
