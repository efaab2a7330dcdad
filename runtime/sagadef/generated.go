package sagadef

import (
	"errors"
	"fmt"
	"reflect"
)

// ErrStaleTable reports that a generated definition's literal state set or
// transition table differs from the one this runtime computes: the contract
// was generated against another runtime version and must be regenerated.
var ErrStaleTable = errors.New("the runtime computes a different transition table than the generated one; regenerate the contract with this runtime")

// CompileGenerated compiles a definition built by generated code and checks
// that the States and Transitions it carries (printed by the generator, and
// shown in its docs) are exactly the ones Compile computes, so the table a
// team reviews is the table that runs.
func (d *Definition) CompileGenerated() error {
	states, transitions := d.States, d.Transitions
	if err := d.Compile(); err != nil {
		return err
	}
	if !reflect.DeepEqual(states, d.States) || !reflect.DeepEqual(transitions, d.Transitions) {
		return fmt.Errorf("saga %s: %w", d.Name, ErrStaleTable)
	}
	return nil
}
