;; Grows its memory 1 MiB at a time for as long as the host lets it.
(module
  (memory 1)
  (func (export "bomb")
    (loop $again
      (br_if $again (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))))
