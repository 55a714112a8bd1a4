"""TFRecord files without TensorFlow: a light reader for the JAX and PyTorch pipelines, and tf.train.Example.

A TFRecord file is a sequence of records, each ``uint64 length | uint32 masked CRC-32C of the length | data |
uint32 masked CRC-32C of the data`` (little-endian). ``RecordFile`` indexes a file by reading only the 12-byte
headers and then reads any record by its offset (``os.pread``: threads share one descriptor). It checks each
length's CRC, which catches a truncated or misaligned file; the data's CRC is TensorFlow's to check (tf.data
reads the same files), as computing it in Python would cost more than the images' decoding.

``encode_example`` / ``parse_example`` write and read the ``tf.train.Example`` protocol buffer of one image: its
encoded bytes ("image") and class index ("label"), the wire format that ``tf.io.parse_single_example`` reads.
"""

import os
import struct

MASK_DELTA = 0xA282EAD8
HEADER_BYTES = 12  # uint64 length + uint32 CRC of it
FOOTER_BYTES = 4  # uint32 CRC of the data


def crc32c_table():
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return table


CRC32C_TABLE = crc32c_table()


def masked_crc32c(data):
    """TFRecord's masked CRC-32C (Castagnoli) of ``data`` (short data: it runs in Python)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


class RecordFile:
    """One TFRecord file: ``len``, ``read(i)`` of record i, after an index of the record offsets."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self.offsets, self.lengths = self.index()

    def index(self):
        offsets, lengths = [], []
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as f:
            position = 0
            while position < size:
                header = f.read(HEADER_BYTES)
                if len(header) < HEADER_BYTES:
                    raise ValueError(f"{self.path} is truncated: a record header at byte {position} is cut short.")
                length, crc = struct.unpack("<QI", header)
                if masked_crc32c(header[:8]) != crc:
                    raise ValueError(f"{self.path} is corrupt: the record at byte {position} has a bad length CRC.")
                offsets.append(position + HEADER_BYTES)
                lengths.append(length)
                position += HEADER_BYTES + length + FOOTER_BYTES
                if position > size:
                    raise ValueError(f"{self.path} is truncated: its record at byte {offsets[-1] - 12} is cut short.")
                f.seek(position)
        return offsets, lengths

    def __len__(self):
        return len(self.offsets)

    def read(self, index):
        fd = os.open(self.path, os.O_RDONLY)
        try:
            return os.pread(fd, self.lengths[index], self.offsets[index])
        finally:
            os.close(fd)


def read_first_record(path):
    """The first record of a TFRecord file (a shard's header), reading nothing else; ValueError if there is none."""
    with open(path, "rb") as f:
        header = f.read(HEADER_BYTES)
        if len(header) < HEADER_BYTES:
            raise ValueError(f"{path} holds no record (it is empty or cut short).")
        length, crc = struct.unpack("<QI", header)
        data = f.read(length) if masked_crc32c(header[:8]) == crc else b""
    if len(data) != length:
        raise ValueError(f"{path}: its first record is corrupt or cut short.")
    return data


# ---- tf.train.Example: Example{features=1: Features{feature=1: map<string, Feature>}}, Feature{bytes_list=1,
# int64_list=3}, BytesList{value=1 (repeated bytes)}, Int64List{value=1 (packed varints)} ----

def varint(value):
    out = bytearray()
    value &= (1 << 64) - 1  # negative int64s as two's complement, as protobuf writes them
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number, payload):
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def encode_example(image_bytes, label):
    """The serialized tf.train.Example of one image: {"image": bytes_list [image_bytes], "label": int64_list
    [label]}."""
    image = field(1, field(1, image_bytes))  # Feature.bytes_list = BytesList(value=[...])
    label = field(3, field(1, varint(int(label))))  # Feature.int64_list = Int64List(value=[...]), packed
    entries = field(1, field(1, b"image") + field(2, image)) + field(1, field(1, b"label") + field(2, label))
    return field(1, entries)


def read_varint(data, position):
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, position


def fields(data):
    """(number, wire type, value) of each field of a message: bytes for length-delimited ones, ints for varints."""
    position = 0
    while position < len(data):
        key, position = read_varint(data, position)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, position = read_varint(data, position)
        elif wire == 2:
            length, position = read_varint(data, position)
            value, position = data[position:position + length], position + length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, position = data[position:position + size], position + size
        else:
            raise ValueError(f"Unsupported protobuf wire type {wire}.")
        yield number, wire, value


def parse_example(data):
    """(image bytes, label) of a serialized tf.train.Example written by ``encode_example`` or TensorFlow."""
    features = {}
    for _, _, entry in fields(next(value for number, _, value in fields(data) if number == 1)):  # map entries
        parts = {n: v for n, _, v in fields(entry)}
        features[bytes(parts.get(1, b""))] = parts.get(2, b"")
    image = next(value for number, _, value in fields(features[b"image"]) if number == 1)
    values = next(value for number, _, value in fields(features[b"label"]) if number == 3)
    label = [v for number, wire, v in fields(values) if number == 1]
    label = read_varint(label[0], 0)[0] if isinstance(label[0], bytes) else label[0]  # packed, or not
    return bytes(next(v for number, _, v in fields(image) if number == 1)), label - (1 << 64) * (label >> 63)
