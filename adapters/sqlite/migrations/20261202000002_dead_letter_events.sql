-- The audit trail of the dead letters: one row per status change (replayed or discarded), by
-- whom and when, written in the same transaction as the change itself, so the history never
-- misses nor invents one. Read per letter in insertion order, hence the index. Times are
-- INTEGER Unix milliseconds, as in `dead_letters`.
create table if not exists dead_letter_events (
    -- autoincrement: ids are never reused, so they order the events of a letter.
    id          integer primary key autoincrement,
    letter_id   integer not null references dead_letters (id) on delete cascade,
    at          integer not null,
    from_status text    not null
                check (from_status in ('pending_review', 'replayed', 'discarded')),
    to_status   text    not null
                check (to_status in ('pending_review', 'replayed', 'discarded')),
    "by"        text    not null
) strict;

create index if not exists dead_letter_events_letter_id on dead_letter_events (letter_id, id);
