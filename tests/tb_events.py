"""Reads TensorBoard event files back (TFRecord framing, tensorboardX's protos)."""

import glob
import os
import struct

from tensorboardX.proto import event_pb2


def read_events(logdir):
  """Every ``Event`` of the event files directly in ``logdir``, in file order."""
  out = []
  for path in sorted(glob.glob(os.path.join(logdir, 'events.out.tfevents.*'))):
    with open(path, 'rb') as f:
      data = f.read()
    i = 0
    while i < len(data):
      (n,) = struct.unpack('<Q', data[i:i + 8])
      i += 12                                       # length, its crc
      out.append(event_pb2.Event.FromString(data[i:i + n]))
      i += n + 4                                    # data, its crc
  return out


def summary_values(logdir):
  """``{tag: [Summary.Value, ...]}`` over all events."""
  values = {}
  for event in read_events(logdir):
    for value in event.summary.value:
      values.setdefault(value.tag, []).append(value)
  return values


def hparams_of(logdir):
  """The HParams plugin's session-start hyperparameters: ``{name: value}``."""
  from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData
  (value,) = summary_values(logdir)['_hparams_/session_start_info']
  data = HParamsPluginData.FromString(value.metadata.plugin_data.content)
  out = {}
  for name, v in data.session_start_info.hparams.items():
    out[name] = getattr(v, v.WhichOneof('kind'))
  return out
