"""The export formats: one table, name -> the exporter's import path
(imported on use, :func:`purax.core.lazy.resolve`). :func:`purax.io.export.export`
and the command line's ``purax export --format`` read it; it imports no jax."""

#: The export formats: name -> ``'module:function'`` of the exporter.
FORMATS = {'jax': 'purax.io.export:export_predict',
           'onnx': 'purax.io.onnx_export:export_onnx',
           'savedmodel': 'purax.io.tf_export:export_savedmodel'}
