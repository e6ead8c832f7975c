import json

from purax.io import writers


def test_default_writer_writes_jsonl_and_event_files(tmp_path):
  w = writers.create_default_writer(str(tmp_path), console=False)
  w.write_scalars(10, {'train/loss': 0.5, 'train/nan': float('nan')})
  w.close()
  records = [json.loads(l) for l in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert records[0]['step'] == 10 and records[0]['train/loss'] == 0.5
  assert records[0]['train/nan'] == 'nan'
  assert list(tmp_path.glob('events.out.tfevents.*'))
