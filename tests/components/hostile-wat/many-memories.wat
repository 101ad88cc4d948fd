;; Eight linear memories of 62.5 MiB each (500 MiB), in two core instances: over a 256 MiB cap
;; only if memories are counted together, per instance.
(component
  (core module $m
    (memory 1000)
    (memory 1000)
    (memory 1000)
    (memory 1000))
  (core instance (instantiate $m))
  (core instance (instantiate $m)))
