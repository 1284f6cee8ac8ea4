-- Placeholder on branch h23-small only: another branch of issue 23 adds
-- the real 0012. Delete this file when merging that branch (the loader
-- refuses two files numbered 0012, and a gap before 0013).
SELECT 1;
