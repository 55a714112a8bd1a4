"""Streaming without TensorFlow: a folder or shards read from disk batch by batch, for JAX and PyTorch.

``StreamRows`` reads the examples a batch asks for: a folder's files decoded by ``decode_image``, or a shard
set's records through the light TFRecord reader (``vit_keras.data.records``), each file indexed once. The
batches are ``vit_keras.data.array_pipeline.ArrayBatches``' (a ``keras.utils.PyDataset`` whose worker threads
decode several batches at once, as Pillow releases the GIL), with the same steps and seeded draws as in memory.
Several processes (JAX's multi-process runs): each reads only its part (every count-th file, the
source's ``part``) and takes the same number of steps.
"""

import bisect

import numpy as np

from vit_keras.data.array_pipeline import WORKERS, ArrayBatches
from vit_keras.data.records import RecordFile
from vit_keras.data.shards import ShardSource


class StreamRows:
    """The rows of a stream source (``vit_keras.data.sources``), read from disk when ``take`` asks for them. An
    unreadable image is skipped (logged in the source's ``skips``) and a readable one of the batch takes its
    place, so batches keep their size."""

    def __init__(self, source):
        self.source = source
        self.labels = np.asarray(source.labels) if not isinstance(source, ShardSource) else None
        self.files = [RecordFile(file) for file in source.files] if isinstance(source, ShardSource) else None
        self.starts = np.cumsum([0, *source.counts[:-1]]).tolist() if self.files else None

    def __len__(self):
        return len(self.source)

    def read(self, row):
        """(uint8 image, label) of row ``row``, or None when it is unreadable."""
        if self.files is None:
            image = self.source.read_or_none(row)
            return None if image is None else (image, self.labels[row])
        file = bisect.bisect_right(self.starts, row) - 1
        record = row - self.starts[file] + 1  # after the header record
        return self.source.decode(self.files[file].read(record), f"{self.source.files[file]} record {record}")

    def take(self, rows):
        examples = [self.read(int(row)) for row in rows]
        readable = [example for example in examples if example is not None]
        if not readable:
            raise ValueError(f"A batch of {len(rows)} images had no readable one ({self.source.source}).")
        examples = [example or readable[i % len(readable)] for i, example in enumerate(examples)]
        return np.stack([image for image, _ in examples]), np.asarray([label for _, label in examples], np.int64)


class StreamBatches(ArrayBatches):
    """``ArrayBatches`` of a stream: in training, epochs of exactly ``steps`` batches (the steps every process
    can take from its part: ``vit_keras.data.sources.steps_per_pass``), the first without its first ``skip``
    (a run resumed mid-epoch goes on with the batches an uninterrupted one would see)."""

    def __init__(self, source, batching, augmentation, steps=None, teacher=None, epoch=0, shard=(0, 1),
                 workers=WORKERS, skip=0):
        super().__init__(StreamRows(source), batching, augmentation.in_training(batching.training), shard, workers,
                         None, teacher if batching.training else None, epoch)
        if batching.training and steps:
            self.batches_per_epoch = int(steps)
        self.skip = skip if batching.training else 0
