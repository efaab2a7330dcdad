package admin

// TimelineOutboxSQLForTest is the timeline's read of a saga's outbox rows:
// $1 the saga id, $2 the limit.
const TimelineOutboxSQLForTest = timelineOutboxSQL
