package syncapp

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// TestOneOwnerPerState holds the shape of the package (see doc.go): each
// piece of a namespace's fleet state has one owner; a request goes from
// the Namespace to an owner and on to the store, a run from the loop or
// a driver to the runner and on to the store, and nothing comes back.
//
//   - Only the types that callers names for a type hold it (in a field, a
//     parameter or a result) or call its methods, or call a function of
//     the package that does: the parts never reach the Namespace, the
//     runner, the loop or the drivers above them. An owner that needs the
//     namespace's zone or store gets the part it needs, or hands the work
//     back in its results. So the loop, which may hold a runner and
//     nothing above it, reaches only the runner attached when it calls
//     back through current.
//   - No expression reaches through two fields into another type's state
//     (n.runner.outbox.failed): each owner is changed through its methods.
//
// It reads the package's own source; imports are not resolved, so only
// what the package declares is checked, which is all these rules are
// about.
func TestOneOwnerPerState(t *testing.T) {
	fset, parsed := parsePackage(t)
	info := &types.Info{
		Selections: make(map[*ast.SelectorExpr]*types.Selection),
		Defs:       make(map[*ast.Ident]types.Object),
		Uses:       make(map[*ast.Ident]types.Object),
	}
	conf := types.Config{
		Importer: fakeImporter{},
		Error:    func(error) {}, // the imports are empty: their names do not resolve
	}
	pkg, _ := conf.Check("syncapp", fset, parsed, info)
	for target := range callers {
		if obj, ok := pkg.Scope().Lookup(target).(*types.TypeName); !ok || obj.IsAlias() {
			t.Fatalf("callers names %s, which is no type of the package", target)
		}
	}
	checkHolders(t, fset, pkg)
	checkCallers(t, fset, parsed, pkg, info)

	for _, f := range parsed {
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			recv := receiverName(fn)
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				inner, ok := sel.X.(*ast.SelectorExpr)
				if !ok || !isField(info, sel) || !isField(info, inner) {
					return true
				}
				owner := ownerName(pkg, info.Selections[sel].Recv())
				if owner != "" && owner != recv {
					t.Errorf("%s: %s reaches through two fields into the state of %s", fset.Position(sel.Pos()), types.ExprString(sel), owner)
				}
				return true
			})
		}
	}
}

// callers are, for each type above the parts, the types that may hold it
// and call it, and why; a type may always call itself. Every other type
// (health, outbox, fetchSet, banTable, slotHolder, inFlight, storeRoad,
// hitQueue, periodicHits, windowSizes, ...) is called from above and
// never reaches these, whether through a field, a parameter, the result
// of a call or a function of the package.
var callers = map[string]map[string]string{
	"AdminAPI": {}, // Caddy's admin server calls it
	"App": {
		"AdminAPI":   "finds the running config's namespaces",
		"zoneHolder": "keys the capacities it keeps by the config that claimed them",
	},
	"Namespace": {
		"App":      "the config that made its namespaces",
		"AdminAPI": "the admin API, above the namespaces",
	},
	"runner": {
		"Namespace":  "Sync, Fetch, Reset and UseBans hand their work to it",
		"App":        "hands it to the loop at start, and flushes it at stop",
		"AdminAPI":   "reads its pending diffs",
		"loop":       "runs the runner attached (current) on its timer",
		"fleetState": "reads the attached runner's pending diffs and interval for the metrics",
	},
	"loop": {
		"App":        "attaches its namespaces' runners, and detaches them",
		"fleetState": "owns it: the loop outlives configs with the rest of the fleet state",
	},
}

// mayReach reports whether the methods of type from may hold and call
// type to.
func mayReach(from, to string) bool {
	allowed, ok := callers[to]
	if !ok || from == to {
		return true
	}
	_, ok = allowed[from]
	return ok
}

// checkHolders fails t for every field, method parameter or method result
// of a type of pkg that holds a type of callers it may not reach.
func checkHolders(t *testing.T, fset *token.FileSet, pkg *types.Package) {
	t.Helper()
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj, ok := scope.Lookup(name).(*types.TypeName)
		if !ok || obj.IsAlias() {
			continue
		}
		named, ok := obj.Type().(*types.Named)
		if !ok {
			continue
		}
		for target := range callers {
			if mayReach(name, target) {
				continue
			}
			if st, ok := named.Underlying().(*types.Struct); ok {
				for f := range st.Fields() {
					if mentions(pkg, f.Type(), target) {
						t.Errorf("%s: %s holds a %s (field %s)", fset.Position(f.Pos()), name, target, f.Name())
					}
				}
			}
			for m := range named.Methods() {
				if mentions(pkg, m.Type(), target) {
					t.Errorf("%s: %s.%s takes or returns a %s", fset.Position(m.Pos()), name, m.Name(), target)
				}
			}
		}
	}
}

// checkCallers fails t for every call, in a method, of a method of a type
// of callers that the method's type may not reach, or of a function of
// the package that holds or calls such a type.
func checkCallers(t *testing.T, fset *token.FileSet, files []*ast.File, pkg *types.Package, info *types.Info) {
	t.Helper()
	// reaches are the types of callers that each function of the package
	// holds or calls.
	reaches := make(map[types.Object][]string)
	for _, f := range files {
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil {
				continue
			}
			obj := info.Defs[fn.Name]
			for target := range callers {
				if mentions(pkg, obj.Type(), target) || fn.Body != nil && callsInto(fn.Body, pkg, info, target) {
					reaches[obj] = append(reaches[obj], target)
				}
			}
		}
	}
	for _, f := range files {
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil || fn.Recv == nil {
				continue
			}
			recv := receiverName(fn)
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.SelectorExpr:
					s, ok := info.Selections[x]
					if !ok || s.Kind() != types.MethodVal {
						return true
					}
					if target := ownerName(pkg, s.Recv()); !mayReach(recv, target) {
						t.Errorf("%s: %s.%s calls back into the %s (%s)", fset.Position(x.Pos()), recv, fn.Name.Name, target, types.ExprString(x))
					}
				case *ast.Ident:
					for _, target := range reaches[info.Uses[x]] {
						if !mayReach(recv, target) {
							t.Errorf("%s: %s.%s calls %s, which reaches the %s", fset.Position(x.Pos()), recv, fn.Name.Name, x.Name, target)
						}
					}
				}
				return true
			})
		}
	}
}

// callsInto reports whether body calls a method of the type of pkg named
// target.
func callsInto(body *ast.BlockStmt, pkg *types.Package, info *types.Info, target string) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if s, ok := info.Selections[sel]; ok && s.Kind() == types.MethodVal && ownerName(pkg, s.Recv()) == target {
				found = true
			}
		}
		return !found
	})
	return found
}

// mentions reports whether type t is, or is built of (pointers, slices,
// maps, channels, functions, unnamed structs), the type of pkg named
// target. A named type's own fields do not count: they are its holding,
// checked on their own.
func mentions(pkg *types.Package, t types.Type, target string) bool {
	switch x := t.(type) {
	case *types.Named:
		return x.Obj().Pkg() == pkg && x.Obj().Name() == target
	case *types.Pointer:
		return mentions(pkg, x.Elem(), target)
	case *types.Slice:
		return mentions(pkg, x.Elem(), target)
	case *types.Array:
		return mentions(pkg, x.Elem(), target)
	case *types.Map:
		return mentions(pkg, x.Key(), target) || mentions(pkg, x.Elem(), target)
	case *types.Chan:
		return mentions(pkg, x.Elem(), target)
	case *types.Signature:
		return mentions(pkg, x.Params(), target) || mentions(pkg, x.Results(), target)
	case *types.Tuple:
		for v := range x.Variables() {
			if mentions(pkg, v.Type(), target) {
				return true
			}
		}
	case *types.Struct:
		for f := range x.Fields() {
			if mentions(pkg, f.Type(), target) {
				return true
			}
		}
	}
	return false
}

func isField(info *types.Info, sel *ast.SelectorExpr) bool {
	s, ok := info.Selections[sel]
	return ok && s.Kind() == types.FieldVal
}

// ownerName returns the name of the type declared in pkg whose field a
// selection reads, or "" for types of other packages.
func ownerName(pkg *types.Package, t types.Type) string {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	if n, ok := t.(*types.Named); ok && n.Obj().Pkg() == pkg {
		return n.Obj().Name()
	}
	return ""
}

func receiverName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return ""
	}
	t := fn.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// fakeImporter gives every import as an empty package.
type fakeImporter struct{}

func (fakeImporter) Import(p string) (*types.Package, error) {
	pkg := types.NewPackage(p, path.Base(p))
	pkg.MarkComplete()
	return pkg, nil
}

// TestDocNamesEveryLock holds doc.go's list of locks to the code: every
// mutex that a type of the package holds in a field is named in doc.go
// as type.field, so a lock added without a word on what it guards and
// where it falls in the order fails here.
func TestDocNamesEveryLock(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	fset, parsed := parsePackage(t)
	found := 0
	for _, f := range parsed {
		ast.Inspect(f, func(n ast.Node) bool {
			spec, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := spec.Type.(*ast.StructType)
			if !ok {
				return true
			}
			for _, field := range st.Fields.List {
				// A pointer to a mutex is another type's lock, lent. A
				// lock is a lockorder one, of a class, so that a build
				// with the lockorder tag checks the order doc.go states.
				typ := field.Type
				if idx, ok := typ.(*ast.IndexExpr); ok {
					typ = idx.X
				}
				sel, ok := typ.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "Mutex" && sel.Sel.Name != "RWMutex" {
					continue
				}
				for _, id := range field.Names {
					found++
					lock := spec.Name.Name + "." + id.Name
					if !bytes.Contains(doc, []byte(lock)) {
						t.Errorf("%s: doc.go does not name the lock %s", fset.Position(id.Pos()), lock)
					}
					if pkg, _ := sel.X.(*ast.Ident); pkg == nil || pkg.Name != "lockorder" || typ == field.Type {
						t.Errorf("%s: the lock %s is not a lockorder lock of a class: its order goes unchecked", fset.Position(id.Pos()), lock)
					}
				}
			}
			return true
		})
	}
	if found == 0 {
		t.Fatal("no lock found: the test reads nothing")
	}
}

// parsePackage parses the package's own source files, its tests left out.
func parsePackage(t *testing.T) (*token.FileSet, []*ast.File) {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var parsed []*ast.File
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, f)
	}
	return fset, parsed
}
