;; A component that returns whatever bytes the host gave it, as the values the host lifts from
;; adapters: `fill` puts the bytes at offset 1024 of its memory (its realloc always answers
;; 1024), `ids` and `page` return a pointer to them.
(component
  (core module $m
    (memory (export "memory") 1)
    (func (export "realloc") (param i32 i32 i32 i32) (result i32) (i32.const 1024))
    (func (export "fill") (param i32 i32))
    (func (export "get") (result i32) (i32.const 1024)))
  (core instance $i (instantiate $m))
  (type $error' (variant
    (case "bad-request" string) (case "gone" string) (case "unavailable" string)
    (case "refused" string) (case "timeout" string) (case "closed" string)
    (case "stale" string) (case "unsupported" string) (case "internal" string)))
  (export $error "error" (type $error'))
  (type $position' (record (field "partition" u32) (field "offset" u64)))
  (export $position "position" (type $position'))
  (type $entry' (record
    (field "id" string)
    (field "pos" $position)
    (field "value" (list u8))
    (field "headers" (list (tuple string (list u8))))
    (field "key" (option (list u8)))))
  (export $entry "entry" (type $entry'))
  (type $page' (record (field "entries" (list $entry)) (field "done" bool)))
  (export $page "log-page" (type $page'))
  (func (export "fill") (param "bytes" (list u8))
    (canon lift (core func $i "fill") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (func (export "ids") (result (result (list string) (error $error)))
    (canon lift (core func $i "get") (memory (core memory $i "memory"))))
  (func (export "page") (result $page)
    (canon lift (core func $i "get") (memory (core memory $i "memory")))))
