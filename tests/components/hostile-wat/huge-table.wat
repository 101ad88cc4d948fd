;; One table of 100 M entries: the cap counts tables too.
(component
  (core module $m
    (table 100000000 funcref))
  (core instance (instantiate $m)))
