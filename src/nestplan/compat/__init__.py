"""The NEST authors' solver format (drop-in mode): input schema, their cost semantics, nest-solve."""
