"""The disk store: fixed-size page records in one preallocated file, verified on every read.

`store` is the tier (`DiskStore`: alloc, free, write, read, scan); `split_store` the tier for a
model with sliding-window layers (`SplitDiskStore`: a record per layer of a page, over a
`DiskStore`); `format` the on-disk layout
of the file (pure); `directory` opens, locks and sets aside the store file; `direct_io` the
positional, O_DIRECT-when-aligned I/O backend; `page_file` batched record I/O; `pipeline`
overlaps checksums with I/O; `scan` the warm-restart header scan; `error_reason` why a record
or file is refused (`DiskErrorReason`: checksum, fingerprint, io).
"""
