"""Where tierserve's file layers are imported from: the input layer (`tierserve.core.inputs`: decoding, CSV,
YAML, JSON, size limits) and the output layer (`tierserve.core.outputs`: staging, manifest, lock, atomic writes).
This module only re-exports them, so `from tierserve.core.files import ...` keeps working.
"""
from __future__ import annotations

from tierserve.core.inputs import (  # noqa: F401
    _CHUNK, _GZIP_MAGIC, _BOMS, _Problem, _not_regular, _open_binary, _decode_problem, _lines, open_lines,
    read_text, CsvTable, read_csv_table, _check_header, _yaml_loader, short_key, _LOADER, _expanded_size,
    MAX_YAML_DEPTH, parse_yaml, _yaml_problem, parse_json, read_mapping,
)
from tierserve.core.outputs import (  # noqa: F401
    PARTIAL_SUFFIX, MANIFEST_JSON, LOCK_FILE, STAGE_PREFIX, _WRITE_ERRNOS, _stages, output_error, shown, is_stage,
    _refuse_non_regular, _check_name_length, check_out_dir, check_out_file, atomic_path, write_text_atomic,
    sha256_of, FolderLock, read_manifest, _staged_files, _remove_listed, _publish, _remove_stale_stages,
    _copy_previous, output_folder,
)
