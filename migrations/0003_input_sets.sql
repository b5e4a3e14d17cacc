-- How many input sets the timing rotated through for each shape (more than one when a
-- set fits in L2, so repeated launches do not just measure the cache).
ALTER TABLE iteration_shapes ADD COLUMN input_sets INTEGER;
