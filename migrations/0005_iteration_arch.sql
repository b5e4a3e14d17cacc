-- The NVRTC target each candidate was compiled for: the device's `sm_90`, or the
-- arch-specific `sm_90a` of templates with `arch_specific = true` (wgmma, setmaxnreg).
-- NULL: not compiled (gated before), or recorded before this column existed.
ALTER TABLE iterations ADD COLUMN arch TEXT;
