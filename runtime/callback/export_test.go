package callback

// SetAfterSend installs a function that runs after a request was answered
// and before its outcome is recorded; an error skips the record, as a
// crash there would.
func (d *Dispatcher) SetAfterSend(fn func(id string) error) { d.afterSend = fn }
