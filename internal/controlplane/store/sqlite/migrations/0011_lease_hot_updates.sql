-- PostgreSQL's 0011 lets a lease's transitions between states that have
-- not ended be heap-only tuple updates there, which writes no index
-- entry; SQLite updates only the index entries of the columns that
-- change, so its schema stays as it is: this migration only keeps the two
-- stores' versions aligned.
SELECT 1;
