"""A committed step's marker and index read without mhckpt (docs/FORMAT.md,
io/marker.cc, io/step_index.h), for tests that read or damage a checkpoint
on disk.

Format 3 writes an array whose boxes are the cells of a grid as "grid" (the
cuts of each dimension) and "writers" (one per cell, row-major), other box
sets as "boxes" without checksums; every box's checksum and chunk checksums
are in index.bin beside data.h5:

    header   8 bytes "MHCKIDX3", the step (int64)
    records  one per box, arrays in marker order, then their boxes: the box's
             XXH3-64, each chunk's, a check word (all little-endian uint64)

Format 2 lists every box with its checksum and chunk checksums in the marker.
"""
import json
import os
import struct

INDEX_MAGIC = b"MHCKIDX3"
INDEX_HEADER_BYTES = 16

DTYPE_BYTES = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
               "int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8,
               "float8_e4m3fn": 1, "float8_e5m2": 1}


def step_dir(root, step):
    return os.path.join(root, "step_%010d" % step)


def marker_path(root, step):
    return os.path.join(step_dir(root, step), "commit.json")


def index_path(root, step):
    return os.path.join(step_dir(root, step), "index.bin")


def read_marker(root, step):
    with open(marker_path(root, step)) as f:
        return json.load(f)


def write_marker(root, step, marker):
    with open(marker_path(root, step), "w") as f:
        f.write(json.dumps(marker) + "\n")


def boxes(array):
    """The boxes of a marker's array, in marker order, as dicts with "start",
    "count" and "writer" (and, format 2, "checksum" and "chunks")."""
    if "boxes" in array:
        return array["boxes"]
    grid, writers = array["grid"], array["writers"]
    out = []
    cell = [0] * len(grid)
    for writer in writers:
        out.append({"start": [grid[d][cell[d]] for d in range(len(grid))],
                    "count": [grid[d][cell[d] + 1] - grid[d][cell[d]] for d in range(len(grid))],
                    "writer": writer})
        d = len(grid)
        while d > 0:
            cell[d - 1] += 1
            if cell[d - 1] + 1 < len(grid[d - 1]):
                break
            cell[d - 1] = 0
            d -= 1
    return out


def grid_as_boxes(array):
    """The array with its grid written out as a list of boxes."""
    array = dict(array)
    array["boxes"] = boxes(array)
    array.pop("grid", None)
    array.pop("writers", None)
    return array


def chunk_rows(count, dtype, chunk_bytes):
    """Rows per chunk of a box (io::ChunkRows)."""
    if not count or count[0] <= 0:
        return 1
    row_bytes = DTYPE_BYTES[dtype]
    for c in count[1:]:
        row_bytes *= c
    if row_bytes == 0:
        return count[0]
    return max(1, min(chunk_bytes // row_bytes, count[0]))


def chunk_count(count, rows):
    """Chunks of a box (io::ChunkCount): 1 for a 0-d or empty box."""
    if not count or count[0] <= 0:
        return 1
    return (count[0] - 1) // rows + 1


def index_records(marker):
    """Format 3: every record of the index, in order, as dicts with "array"
    (its name), "box" (the box dict), "offset" and "bytes"."""
    out = []
    at = INDEX_HEADER_BYTES
    for a in marker["arrays"]:
        for b in boxes(a):
            n = 16 + 8 * chunk_count(b["count"], chunk_rows(b["count"], a["dtype"], marker["chunk_bytes"]))
            if marker.get("files", 0) > 0:
                n += 16  # the box's subfile and offset

            out.append({"array": a["name"], "box": b, "offset": at, "bytes": n})
            at += n
    return out


def index_bytes(marker):
    """Format 3: the index's size, from the marker's boxes alone."""
    records = index_records(marker)
    return records[-1]["offset"] + records[-1]["bytes"] if records else INDEX_HEADER_BYTES


def record_of(marker, array, box=0):
    """Format 3: the record of box number `box` of the array named `array`."""
    return [r for r in index_records(marker) if r["array"] == array][box]


def record_values(root, step, record):
    with open(index_path(root, step), "rb") as f:
        f.seek(record["offset"])
        data = f.read(record["bytes"])
    return struct.unpack("<%dQ" % (len(data) // 8), data)


def read_record(root, step, record, marker=None):
    """(box checksum, [chunk checksums]) of an index record, as integers;
    pass the marker if the step may have subfiles."""
    values = record_values(root, step, record)
    end = -3 if marker is not None and marker.get("files", 0) > 0 else -1
    return values[0], list(values[1:end])


def read_place(root, step, record):
    """A step with subfiles: (subfile path, byte offset) of a record's box."""
    values = record_values(root, step, record)
    return os.path.join(step_dir(root, step), "data-%05d.h5" % values[-3]), values[-2]


def read_index_header(root, step):
    """(magic, step) of a step's index."""
    with open(index_path(root, step), "rb") as f:
        data = f.read(INDEX_HEADER_BYTES)
    return data[:8], struct.unpack("<q", data[8:16])[0]


def checksum_string(value):
    """A checksum as the marker and `mhckpt inspect --json` write it."""
    return "xxh3:%016x" % value


def box_string(box):
    """A box as mhckpt names it: [5:7, 0:5]."""
    return "[%s]" % ", ".join("%d:%d" % (s, s + c) for s, c in zip(box["start"], box["count"]))


def flip_byte(path, at, mask=0x10):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ mask]))
