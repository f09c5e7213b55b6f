-- SQLite's 0005 dropped AUTOINCREMENT from events.id (it made every commit
-- write sqlite_sequence too). PostgreSQL's events.id is a sequence from
-- version 1 on: IDs only grow (events are appended under one lock, so
-- they also become visible in order; see doc.go). Nothing to change.
SELECT 1;
